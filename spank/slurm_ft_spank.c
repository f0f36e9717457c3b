/*
 * slurm-ft SPANK plugin: the --ft and --ft-* options of sbatch, srun and salloc.
 *
 *   --ft                      enable slurm-ft for the job (any --ft-* option implies it)
 *   --ft-ckpt-dir=PATH        checkpoint directory (absolute path)
 *   --ft-ckpt-every=STEPS     checkpoint interval in steps (positive integer), or "auto" (Young/Daly interval
 *                             from the measured checkpoint cost and the observed failure rate)
 *   --ft-max-restarts=N       restart budget (non-negative integer)
 *   --ft-hang-timeout=SECS    seconds without a heartbeat before a rank counts as hung (positive integer)
 *   --ft-spare-nodes=N        nodes held back to replace a bad one (non-negative integer)
 *   --ft-no-requeue           never requeue: restart in place or stop
 *
 * A bad value makes the command refuse with "slurm-ft: --ft-<name>: '<value>' is not ...".
 * In the allocator/local context (sbatch, salloc, srun) the values are exported with
 * spank_job_control_setenv as FT_<NAME>, so the job sees SLURM_SPANK_FT_<NAME> and the prolog/epilog
 * SPANK_FT_<NAME>. In the remote context (slurmstepd) they are also set as SLURM_FT_<NAME> in the task
 * environment. Nothing else happens here: the plugin stays small, every return code is checked.
 */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(slurm_ft, 1);

#define FT_PREFIX "slurm-ft: "
#define FT_VALUE_MAX 4096

enum ft_kind { FT_FLAG, FT_PATH, FT_POSITIVE, FT_NON_NEGATIVE, FT_POSITIVE_OR_AUTO };

struct ft_setting {
	const char *option;   /* long option name, without "--" */
	const char *env;      /* suffix exported as FT_<env> */
	enum ft_kind kind;
	long max;             /* upper bound for integers */
	const char *arginfo;
	const char *usage;
};

/* Every global is static: a global named like one of sbatch's own (e.g. "opt") silently breaks options. */
static const struct ft_setting ft_settings[] = {
	{"ft", "ENABLED", FT_FLAG, 0, NULL, "Enable slurm-ft fault tolerance for this job"},
	{"ft-ckpt-dir", "CKPT_DIR", FT_PATH, 0, "path", "slurm-ft: checkpoint directory (absolute path)"},
	{"ft-ckpt-every", "CKPT_EVERY", FT_POSITIVE_OR_AUTO, 1000000000L, "steps|auto",
	 "slurm-ft: checkpoint every N steps, or auto (from checkpoint cost and failure rate)"},
	{"ft-max-restarts", "MAX_RESTARTS", FT_NON_NEGATIVE, 10000L, "n", "slurm-ft: restart budget"},
	{"ft-hang-timeout", "HANG_TIMEOUT", FT_POSITIVE, 31536000L, "seconds",
	 "slurm-ft: seconds without progress before a rank counts as hung"},
	{"ft-spare-nodes", "SPARE_NODES", FT_NON_NEGATIVE, 10000L, "n", "slurm-ft: spare nodes held in the allocation"},
	{"ft-no-requeue", "NO_REQUEUE", FT_FLAG, 0, NULL, "slurm-ft: never requeue, restart in place or stop"},
};

#define FT_COUNT ((int)(sizeof(ft_settings) / sizeof(ft_settings[0])))

static char ft_values[FT_COUNT][FT_VALUE_MAX];
static int ft_given[FT_COUNT];
static int ft_enabled;

/* Returns NULL when ok, else the reason the value is refused ("is not a non-negative integer" ...). */
static const char *ft_check_integer(const char *text, long min, long max)
{
	char *end = NULL;
	long value;

	if (text == NULL || *text == '\0' || !isdigit((unsigned char)text[0]))
		return min > 0 ? "is not a positive integer" : "is not a non-negative integer";
	errno = 0;
	value = strtol(text, &end, 10);
	if (errno != 0 || end == NULL || *end != '\0')
		return min > 0 ? "is not a positive integer" : "is not a non-negative integer";
	if (value < min)
		return "is not a positive integer";
	if (value > max)
		return "is too large";
	return NULL;
}

/* A positive integer up to max, or exactly the word "auto". */
static const char *ft_check_steps_or_auto(const char *text, long max)
{
	if (text != NULL && strcmp(text, "auto") == 0)
		return NULL;
	if (ft_check_integer(text, 1, LONG_MAX) != NULL)
		return "is not a positive integer or 'auto'";
	return ft_check_integer(text, 1, max);
}

static const char *ft_check_path(const char *text)
{
	size_t len, i;

	if (text == NULL || text[0] != '/')
		return "is not an absolute path";
	len = strlen(text);
	if (len >= PATH_MAX || len >= FT_VALUE_MAX)
		return "is too long";
	for (i = 0; i < len; i++) {
		if (iscntrl((unsigned char)text[i]))
			return "contains a control character";
	}
	return NULL;
}

/* Validate optarg for setting i; returns NULL or the reason. */
static const char *ft_check(int i, const char *optarg)
{
	const struct ft_setting *s = &ft_settings[i];

	switch (s->kind) {
	case FT_FLAG:
		return NULL;
	case FT_PATH:
		return ft_check_path(optarg);
	case FT_POSITIVE:
		return ft_check_integer(optarg, 1, s->max);
	case FT_NON_NEGATIVE:
		return ft_check_integer(optarg, 0, s->max);
	case FT_POSITIVE_OR_AUTO:
		return ft_check_steps_or_auto(optarg, s->max);
	}
	return "has an unknown kind";
}

static void ft_refuse(int i, const char *optarg, const char *why)
{
	slurm_error(FT_PREFIX "--%s: '%.200s' %s", ft_settings[i].option, optarg ? optarg : "", why);
}

static int ft_option_cb(int val, const char *optarg, int remote)
{
	const char *why;
	(void)remote;

	if (val < 0 || val >= FT_COUNT)
		return -1;
	why = ft_check(val, optarg);
	if (why != NULL) {
		ft_refuse(val, optarg, why);
		return -1;
	}
	if (ft_settings[val].kind == FT_FLAG) {
		snprintf(ft_values[val], FT_VALUE_MAX, "1");
	} else if (snprintf(ft_values[val], FT_VALUE_MAX, "%s", optarg) >= FT_VALUE_MAX) {
		ft_refuse(val, optarg, "is too long");
		return -1;
	}
	ft_given[val] = 1;
	ft_enabled = 1; /* any --ft-* option implies --ft */
	return 0;
}

static struct spank_option ft_options[FT_COUNT];

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;
	spank_err_t rc;
	(void)ac;
	(void)av;

	for (i = 0; i < FT_COUNT; i++) {
		ft_options[i].name = (char *)ft_settings[i].option;
		ft_options[i].arginfo = (char *)ft_settings[i].arginfo;
		ft_options[i].usage = (char *)ft_settings[i].usage;
		ft_options[i].has_arg = ft_settings[i].kind == FT_FLAG ? 0 : 1;
		ft_options[i].val = i;
		ft_options[i].cb = ft_option_cb;
		rc = spank_option_register(sp, &ft_options[i]);
		if (rc != ESPANK_SUCCESS) {
			slurm_error(FT_PREFIX "cannot register --%s: %s", ft_settings[i].option, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

typedef spank_err_t (*ft_setenv_fn)(spank_t, const char *, const char *, int);

/* Set <prefix><NAME> for --ft (always "1") and every --ft-* option given, through setter. */
static int ft_export(spank_t sp, const char *prefix, ft_setenv_fn setter)
{
	char name[64];
	int i;
	spank_err_t rc;

	for (i = 0; i < FT_COUNT; i++) {
		const char *value = i == 0 ? "1" : ft_values[i];
		if (i != 0 && !ft_given[i])
			continue;
		snprintf(name, sizeof(name), "%s%s", prefix, ft_settings[i].env);
		rc = setter(sp, name, value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error(FT_PREFIX "cannot export %s: %s", name, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* Export FT_<NAME> (job control env) in sbatch/salloc/srun. */
static int ft_export_control(spank_t sp)
{
	return ft_export(sp, "FT_", spank_job_control_setenv);
}

/* Set SLURM_FT_<NAME> in the task environment (slurmstepd). */
static int ft_export_task(spank_t sp)
{
	return ft_export(sp, "SLURM_FT_", spank_setenv);
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	(void)ac;
	(void)av;

	if (!ft_enabled)
		return 0;
	if (ctx == S_CTX_ALLOCATOR || ctx == S_CTX_LOCAL)
		return ft_export_control(sp);
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;

	if (!ft_enabled || spank_context() != S_CTX_REMOTE)
		return 0;
	return ft_export_task(sp);
}
