/* Self-test of the slurm-ft SPANK plugin's option handling, with the SPANK API stubbed (no Slurm needed). */
#include <stdarg.h>

#include "slurm_ft_spank.c"

static char last_error[1024];
static char exported[16][2][FT_VALUE_MAX];
static int n_exported;
static spank_context_t fake_ctx = S_CTX_ALLOCATOR;
static int failures;

void slurm_error(const char *format, ...)
{
	va_list ap;
	va_start(ap, format);
	vsnprintf(last_error, sizeof(last_error), format, ap);
	va_end(ap);
}

spank_context_t spank_context(void) { return fake_ctx; }

const char *spank_strerror(spank_err_t err) { return err == ESPANK_SUCCESS ? "Success" : "Error"; }

spank_err_t spank_option_register(spank_t sp, struct spank_option *o)
{
	(void)sp;
	return o->cb != NULL ? ESPANK_SUCCESS : ESPANK_BAD_ARG;
}

static spank_err_t record(const char *name, const char *value)
{
	if (n_exported >= 16)
		return ESPANK_ERROR;
	snprintf(exported[n_exported][0], FT_VALUE_MAX, "%s", name);
	snprintf(exported[n_exported][1], FT_VALUE_MAX, "%s", value);
	n_exported++;
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value, int overwrite)
{
	(void)sp;
	(void)overwrite;
	return record(name, value);
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	(void)sp;
	(void)overwrite;
	return record(var, val);
}

#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); \
	printf(__VA_ARGS__); printf("\n"); } } while (0)

static int find(const char *option)
{
	int i;
	for (i = 0; i < FT_COUNT; i++)
		if (strcmp(ft_settings[i].option, option) == 0)
			return i;
	return -1;
}

static void refused(const char *option, const char *value, const char *message)
{
	last_error[0] = '\0';
	CHECK(ft_option_cb(find(option), value, 0) == -1, "--%s=%s accepted", option, value);
	CHECK(strcmp(last_error, message) == 0, "--%s=%s: got \"%s\", want \"%s\"", option, value, last_error, message);
}

static void accepted(const char *option, const char *value)
{
	CHECK(ft_option_cb(find(option), value, 0) == 0, "--%s=%s refused: %s", option, value, last_error);
}

static const char *value_of(const char *name)
{
	int i;
	for (i = 0; i < n_exported; i++)
		if (strcmp(exported[i][0], name) == 0)
			return exported[i][1];
	return NULL;
}

static int nodes_of(const char *line)
{
	char buf[512], *words[32];
	int n = 0;

	snprintf(buf, sizeof(buf), "%s", line);
	for (char *w = strtok(buf, " "); w != NULL && n < 32; w = strtok(NULL, " "))
		words[n++] = w;
	return (int)ft_nodes_from_args(n, words);
}

static void reset(void)
{
	memset(ft_given, 0, sizeof(ft_given));
	memset(ft_values, 0, sizeof(ft_values));
	ft_default_ckpt_dir[0] = '\0';
	ft_enabled = 0;
	last_error[0] = '\0';
}

/* What sbatch refuses before queueing: --ft without a checkpoint dir, spares >= nodes; plugstack arguments. */
static void check_job_refusals(void)
{
	char *argv_spares[] = {"sbatch", "-N2", "--ft-spare-nodes=2", "job.sh"};
	char *args_ok[] = {"default_ckpt_dir=/scratch/ckpt"};
	char *args_bad[] = {"default_ckpt=/x"};
	char *args_relative[] = {"default_ckpt_dir=ckpt"};

	CHECK(nodes_of("sbatch -N2 job.sh") == 2, "-N2");
	CHECK(nodes_of("sbatch -N 3 --ft job.sh") == 3, "-N 3");
	CHECK(nodes_of("sbatch --nodes=2-4 job.sh") == 4, "--nodes=2-4: the largest");
	CHECK(nodes_of("sbatch --nodes 5 job.sh") == 5, "--nodes 5");
	CHECK(nodes_of("sbatch job.sh -N 1") == -1, "a script argument is not sbatch's");
	CHECK(nodes_of("sbatch -J name -N2 job.sh") == -1, "stops at the first bare word (an option value)");
	CHECK(nodes_of("sbatch -Nx job.sh") == -1, "-Nx is no node count");

	reset();
	accepted("ft", NULL);
	last_error[0] = '\0';
	CHECK(ft_check_job(1, argv_spares) == -1 && strcmp(last_error, "slurm-ft: --ft needs --ft-ckpt-dir=PATH "
	      "(absolute, on a file system all nodes share): where checkpoints, heartbeats and error files go") == 0,
	      "--ft without a checkpoint dir: \"%s\"", last_error);
	accepted("ft-ckpt-dir", "/ckpt/run1");
	accepted("ft-spare-nodes", "2");
	CHECK(ft_check_job(4, argv_spares) == -1 && strcmp(last_error, "slurm-ft: --ft-spare-nodes=2 leaves none of "
	      "the job's 2 node(s) to train on: ask for -N3 or more, or fewer spares") == 0, "spares: \"%s\"",
	      last_error);
	CHECK(ft_check_job(0, argv_spares) == 0, "no command line: the launcher checks spares at start");

	reset();
	CHECK(ft_plugin_args(1, args_bad) == -1 && strstr(last_error, "unknown argument 'default_ckpt=/x'"), "bad arg");
	CHECK(ft_plugin_args(1, args_relative) == -1 && strstr(last_error, "is not an absolute path"), "relative");
	CHECK(ft_plugin_args(1, args_ok) == 0, "default_ckpt_dir");
	accepted("ft", NULL);
	CHECK(ft_check_job(0, argv_spares) == 0, "a site default makes --ft alone fine");
	ft_apply_default();
	CHECK(ft_given[FT_CKPT_DIR] && strcmp(ft_values[FT_CKPT_DIR], "/scratch/ckpt") == 0, "default applied");
}

int main(void)
{
	char long_path[PATH_MAX + 10];

	CHECK(slurm_spank_init(NULL, 0, NULL) == 0, "init failed");
	CHECK(slurm_spank_init_post_opt(NULL, 0, NULL) == 0 && n_exported == 0, "exported without --ft");

	refused("ft-max-restarts", "x", "slurm-ft: --ft-max-restarts: 'x' is not a non-negative integer");
	refused("ft-max-restarts", "-1", "slurm-ft: --ft-max-restarts: '-1' is not a non-negative integer");
	refused("ft-max-restarts", "3 ", "slurm-ft: --ft-max-restarts: '3 ' is not a non-negative integer");
	refused("ft-max-restarts", "99999999999999999999", "slurm-ft: --ft-max-restarts: '99999999999999999999' is not a non-negative integer");
	refused("ft-max-restarts", "10001", "slurm-ft: --ft-max-restarts: '10001' is too large");
	refused("ft-hang-timeout", "10m", "slurm-ft: --ft-hang-timeout: '10m' is not a non-negative integer");
	refused("ft-ckpt-every", "", "slurm-ft: --ft-ckpt-every: '' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "autox", "slurm-ft: --ft-ckpt-every: 'autox' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "AUTO", "slurm-ft: --ft-ckpt-every: 'AUTO' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "auto ", "slurm-ft: --ft-ckpt-every: 'auto ' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "0", "slurm-ft: --ft-ckpt-every: '0' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "-1", "slurm-ft: --ft-ckpt-every: '-1' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "5x", "slurm-ft: --ft-ckpt-every: '5x' is not a positive integer or 'auto'");
	refused("ft-ckpt-every", "1000000001", "slurm-ft: --ft-ckpt-every: '1000000001' is too large");
	refused("ft-mem-every", "", "slurm-ft: --ft-mem-every: '' is not a positive integer, 'auto' or 'off'");
	refused("ft-mem-every", "OFF", "slurm-ft: --ft-mem-every: 'OFF' is not a positive integer, 'auto' or 'off'");
	refused("ft-mem-every", "0", "slurm-ft: --ft-mem-every: '0' is not a positive integer, 'auto' or 'off'");
	refused("ft-mem-every", "1000000001", "slurm-ft: --ft-mem-every: '1000000001' is too large");
	refused("ft-spare-nodes", "+1", "slurm-ft: --ft-spare-nodes: '+1' is not a non-negative integer");
	refused("ft-ckpt-dir", "relative/dir", "slurm-ft: --ft-ckpt-dir: 'relative/dir' is not an absolute path");
	refused("ft-ckpt-dir", "/a\nb", "slurm-ft: --ft-ckpt-dir: '/a\nb' contains a control character");
	memset(long_path, 'a', sizeof(long_path) - 1);
	long_path[0] = '/';
	long_path[sizeof(long_path) - 1] = '\0';
	last_error[0] = '\0';
	CHECK(ft_option_cb(find("ft-ckpt-dir"), long_path, 0) == -1 && strstr(last_error, "is too long"), "long path");
	CHECK(!ft_enabled, "a refused option enabled slurm-ft");

	accepted("ft-max-restarts", "0");
	accepted("ft-max-restarts", "5");
	accepted("ft-ckpt-dir", "/shared/ckpt/run 1");
	accepted("ft-hang-timeout", "0"); /* off, as slurm-ft launch --hang-timeout 0 */
	accepted("ft-hang-timeout", "600");
	accepted("ft-ckpt-every", "1000000000");
	accepted("ft-ckpt-every", "auto");
	accepted("ft-mem-every", "off");
	accepted("ft-mem-every", "auto");
	accepted("ft-mem-every", "4");
	accepted("ft-no-requeue", NULL);
	CHECK(ft_enabled, "--ft-* did not imply --ft");

	CHECK(slurm_spank_init_post_opt(NULL, 0, NULL) == 0, "allocator export failed");
	CHECK(value_of("FT_ENABLED") && strcmp(value_of("FT_ENABLED"), "1") == 0, "FT_ENABLED");
	CHECK(value_of("FT_MAX_RESTARTS") && strcmp(value_of("FT_MAX_RESTARTS"), "5") == 0, "FT_MAX_RESTARTS");
	CHECK(value_of("FT_CKPT_DIR") && strcmp(value_of("FT_CKPT_DIR"), "/shared/ckpt/run 1") == 0, "FT_CKPT_DIR");
	CHECK(value_of("FT_NO_REQUEUE") && strcmp(value_of("FT_NO_REQUEUE"), "1") == 0, "FT_NO_REQUEUE");
	CHECK(value_of("FT_CKPT_EVERY") && strcmp(value_of("FT_CKPT_EVERY"), "auto") == 0, "FT_CKPT_EVERY");
	CHECK(value_of("FT_SPARE_NODES") == NULL, "FT_SPARE_NODES exported though not given");
	CHECK(value_of("FT_MEM_EVERY") && strcmp(value_of("FT_MEM_EVERY"), "4") == 0, "FT_MEM_EVERY");
	CHECK(n_exported == 7, "exported %d names", n_exported);

	n_exported = 0;
	CHECK(slurm_spank_user_init(NULL, 0, NULL) == 0 && n_exported == 0, "user_init exported outside remote");
	fake_ctx = S_CTX_REMOTE;
	CHECK(slurm_spank_init_post_opt(NULL, 0, NULL) == 0 && n_exported == 0, "post_opt exported in remote");
	CHECK(slurm_spank_user_init(NULL, 0, NULL) == 0, "remote export failed");
	CHECK(value_of("SLURM_FT_HANG_TIMEOUT") && strcmp(value_of("SLURM_FT_HANG_TIMEOUT"), "600") == 0,
	      "SLURM_FT_HANG_TIMEOUT");
	CHECK(value_of("SLURM_FT_ENABLED") != NULL, "SLURM_FT_ENABLED");

	check_job_refusals();

	printf("spank selftest: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
	return failures ? 1 : 0;
}
