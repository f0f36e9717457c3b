/*
 * slurm-ft SPANK plugin: the --ft and --ft-* options of sbatch, srun and salloc.
 *
 *   --ft                      enable slurm-ft for the job (any --ft-* option implies it)
 *   --ft-ckpt-dir=PATH        checkpoint directory (absolute path)
 *   --ft-ckpt-every=STEPS     checkpoint interval in steps (positive integer), or "auto" (Young/Daly interval
 *                             from the measured checkpoint cost and the observed failure rate)
 *   --ft-max-restarts=N       restart budget: in-place restarts and requeues together (non-negative integer)
 *   --ft-hang-timeout=SECS    seconds without a heartbeat before a rank counts as hung (0: off)
 *   --ft-spare-nodes=N        nodes held back to replace a bad one (non-negative integer)
 *   --ft-no-requeue           never requeue: restart in place or stop
 *   --ft-mem-every=STEPS      memory-tier snapshots in /dev/shm every N steps (positive integer), "auto" (as often
 *                             as the measured stall allows) or "off"
 *
 * A bad value makes the command refuse with "slurm-ft: --ft-<name>: '<value>' is not ...".
 * sbatch/salloc also refuse, before anything is queued, what cannot work:
 *   --ft (or any --ft-*) without --ft-ckpt-dir, unless plugstack.conf gives the site's default_ckpt_dir=PATH
 *     (then that is the job's checkpoint directory);
 *   --ft-spare-nodes=S with -N/--nodes N on the command line and S >= N (no node left to train on). Only the
 *     leading options of the command line are read (up to the first bare word: an option value or the script),
 *     so a node count from #SBATCH lines is not seen; the launcher refuses that case when the job starts.
 * plugstack.conf arguments: default_ckpt_dir=PATH (absolute). Any other argument fails the plugin's load.
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

enum ft_kind { FT_FLAG, FT_PATH, FT_POSITIVE, FT_NON_NEGATIVE, FT_POSITIVE_OR_AUTO, FT_POSITIVE_AUTO_OR_OFF };

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
	{"ft-max-restarts", "MAX_RESTARTS", FT_NON_NEGATIVE, 10000L, "n",
	 "slurm-ft: restart budget (in-place restarts and requeues together)"},
	{"ft-hang-timeout", "HANG_TIMEOUT", FT_NON_NEGATIVE, 31536000L, "seconds",
	 "slurm-ft: seconds without progress before a rank counts as hung (0: off)"},
	{"ft-spare-nodes", "SPARE_NODES", FT_NON_NEGATIVE, 10000L, "n", "slurm-ft: spare nodes held in the allocation"},
	{"ft-no-requeue", "NO_REQUEUE", FT_FLAG, 0, NULL, "slurm-ft: never requeue, restart in place or stop"},
	{"ft-mem-every", "MEM_EVERY", FT_POSITIVE_AUTO_OR_OFF, 1000000000L, "steps|auto|off",
	 "slurm-ft: memory-tier snapshot every N steps, auto (as often as its stall allows) or off"},
};

#define FT_COUNT ((int)(sizeof(ft_settings) / sizeof(ft_settings[0])))
#define FT_CKPT_DIR 1    /* index of ft-ckpt-dir in ft_settings */
#define FT_SPARE_NODES 5 /* index of ft-spare-nodes */
#define FT_ARGS_MAX 512  /* command-line words read from /proc/self/cmdline */

static char ft_values[FT_COUNT][FT_VALUE_MAX];
static int ft_given[FT_COUNT];
static int ft_enabled;
static char ft_default_ckpt_dir[FT_VALUE_MAX]; /* plugstack.conf default_ckpt_dir=PATH, or "" */

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

/* A positive integer up to max, "auto" or "off". */
static const char *ft_check_steps_auto_or_off(const char *text, long max)
{
	if (text != NULL && strcmp(text, "off") == 0)
		return NULL;
	if (ft_check_steps_or_auto(text, max) == NULL)
		return NULL;
	if (ft_check_integer(text, 1, LONG_MAX) == NULL)
		return "is too large";
	return "is not a positive integer, 'auto' or 'off'";
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
	case FT_POSITIVE_AUTO_OR_OFF:
		return ft_check_steps_auto_or_off(optarg, s->max);
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

/* plugstack.conf arguments: "default_ckpt_dir=PATH" only. Returns 0, or -1 with the reason logged. */
static int ft_plugin_args(int ac, char **av)
{
	const char *key = "default_ckpt_dir=";
	const char *why;
	int i;

	for (i = 0; i < ac; i++) {
		if (av[i] == NULL || strncmp(av[i], key, strlen(key)) != 0) {
			slurm_error(FT_PREFIX "plugstack.conf: unknown argument '%.200s' (known: default_ckpt_dir=PATH)",
				    av[i] ? av[i] : "");
			return -1;
		}
		why = ft_check_path(av[i] + strlen(key));
		if (why != NULL) {
			slurm_error(FT_PREFIX "plugstack.conf: default_ckpt_dir '%.200s' %s", av[i] + strlen(key), why);
			return -1;
		}
		snprintf(ft_default_ckpt_dir, FT_VALUE_MAX, "%s", av[i] + strlen(key));
	}
	return 0;
}

/* The largest node count of a -N/--nodes value ("4" or "2-4"), or -1 when it is not one. */
static long ft_node_count(const char *text)
{
	const char *dash = text ? strchr(text, '-') : NULL;

	if (text == NULL)
		return -1;
	if (dash != NULL)
		text = dash + 1;
	if (ft_check_integer(text, 1, 1000000L) != NULL)
		return -1;
	return strtol(text, NULL, 10);
}

/* -N/--nodes from sbatch's leading options (argv[1] up to the first bare word), or -1 when not given there. */
static long ft_nodes_from_args(int argc, char **argv)
{
	long nodes = -1;
	int i;

	for (i = 1; i < argc && argv[i][0] == '-' && strcmp(argv[i], "--") != 0; i++) {
		if (strcmp(argv[i], "-N") == 0 || strcmp(argv[i], "--nodes") == 0) {
			if (i + 1 >= argc)
				break;
			nodes = ft_node_count(argv[++i]);
		} else if (strncmp(argv[i], "--nodes=", 8) == 0) {
			nodes = ft_node_count(argv[i] + 8);
		} else if (strncmp(argv[i], "-N", 2) == 0) {
			nodes = ft_node_count(argv[i] + 2);
		}
	}
	return nodes;
}

/* This process's command line as words (NUL-separated in /proc/self/cmdline); the word count, or -1. */
static int ft_read_cmdline(char *buf, size_t size, char **words, int max_words)
{
	FILE *f = fopen("/proc/self/cmdline", "r");
	size_t len, i;
	int n = 0;

	if (f == NULL)
		return -1;
	len = fread(buf, 1, size - 1, f);
	if (fclose(f) != 0 || len == 0 || len >= size - 1)
		return -1; /* unreadable, or longer than the buffer: do not guess */
	buf[len] = '\0';
	for (i = 0; i < len && n < max_words; i += strlen(buf + i) + 1)
		words[n++] = buf + i;
	return n;
}

/* What sbatch/salloc can refuse before anything is queued; 0, or -1 with the reason logged. */
static int ft_check_job(int argc, char **argv)
{
	long nodes, spares;

	if (!ft_given[FT_CKPT_DIR] && ft_default_ckpt_dir[0] == '\0') {
		slurm_error(FT_PREFIX "--ft needs --ft-ckpt-dir=PATH (absolute, on a file system all nodes share): "
			    "where checkpoints, heartbeats and error files go");
		return -1;
	}
	if (!ft_given[FT_SPARE_NODES] || argc <= 0)
		return 0;
	nodes = ft_nodes_from_args(argc, argv);
	spares = strtol(ft_values[FT_SPARE_NODES], NULL, 10);
	if (nodes > 0 && spares >= nodes) {
		slurm_error(FT_PREFIX "--ft-spare-nodes=%ld leaves none of the job's %ld node(s) to train on: "
			    "ask for -N%ld or more, or fewer spares", spares, nodes, spares + 1);
		return -1;
	}
	return 0;
}

/* The site's default checkpoint dir for a job that named none (same in every context). */
static void ft_apply_default(void)
{
	if (ft_given[FT_CKPT_DIR] || ft_default_ckpt_dir[0] == '\0')
		return;
	snprintf(ft_values[FT_CKPT_DIR], FT_VALUE_MAX, "%s", ft_default_ckpt_dir);
	ft_given[FT_CKPT_DIR] = 1;
}

static struct spank_option ft_options[FT_COUNT];

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;
	spank_err_t rc;

	if (ft_plugin_args(ac, av) != 0)
		return -1;
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

	static char cmdline[65536];
	char *words[FT_ARGS_MAX];
	int n;

	if (!ft_enabled)
		return 0;
	if (ctx == S_CTX_ALLOCATOR) {
		n = ft_read_cmdline(cmdline, sizeof(cmdline), words, FT_ARGS_MAX);
		if (ft_check_job(n, words) != 0)
			return -1;
	}
	ft_apply_default();
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
	ft_apply_default();
	return ft_export_task(sp);
}
