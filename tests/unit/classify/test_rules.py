"""Rules as data: the shipped table, overrides from files and the site config, and errors that name the culprit."""

from __future__ import annotations

import textwrap

import pytest

from slurm_ft.classify import Action, Category, Evidence, JobEnd, LogTail, classify, load_rules, xid_info
from slurm_ft.classify.rules import SHIPPED_RULES, build_rules, default_rules, load_xid_table
from slurm_ft.classify.xid import XidKind
from slurm_ft.core.config import SiteConfig
from slurm_ft.core.errors import ConfigError


def _write(tmp_path, text, name="site.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_shipped_rules_load_and_name_their_source():
    rules = default_rules()
    assert rules.sources == (str(SHIPPED_RULES),)
    assert set(rules.categories) == set(Category)
    assert len(rules.signatures) >= 60


def test_xid_table_is_complete_and_cautious():
    table = load_xid_table()
    assert set(range(1, 173)) <= set(table)
    assert {x for x, info in table.items() if info.kind is XidKind.DRAIN} >= {48, 64, 74, 79, 94, 95, 119, 120, 140}
    assert table[45].kind is XidKind.SECONDARY
    assert table[13].kind is XidKind.APPLICATION and table[31].kind is XidKind.APPLICATION
    assert table[63].kind is XidKind.WATCH and table[92].kind is XidKind.WATCH
    assert xid_info(10_000).kind is XidKind.WATCH  # unlisted: unknown_xid


def test_xid_154_escalates_only_on_the_new_action():
    info = xid_info(154)
    assert info.kind_for("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)") is XidKind.DRAIN
    assert info.kind_for("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)") is XidKind.WATCH


def test_recoverability_table():
    rules = default_rules()
    expected = {
        Category.HARDWARE_GPU: Action.REQUEUE_EXCLUDE, Category.HARDWARE_NODE: Action.REQUEUE_EXCLUDE,
        Category.NETWORK: Action.REQUEUE, Category.HANG: Action.REQUEUE, Category.PREEMPTION: Action.REQUEUE,
        Category.STORAGE: Action.REQUEUE, Category.USER_CODE: Action.STOP, Category.OOM_GPU: Action.STOP,
        Category.OOM_HOST: Action.STOP, Category.NUMERICAL: Action.STOP, Category.CONFIG: Action.STOP,
        Category.TIME_LIMIT: Action.REQUEUE, Category.CANCELLED: Action.NONE, Category.UNKNOWN: Action.REQUEUE,
    }
    assert {c: rules.policy(c).action for c in Category} == expected
    assert rules.policy(Category.NETWORK).in_allocation_action is Action.RESTART_IN_PLACE


def test_exception_lookup_order():
    rules = default_rules()
    assert rules.exception("torch.OutOfMemoryError").category is Category.OOM_GPU  # last component
    assert rules.exception("mypkg.BadShardError").id == "exception.*"  # CamelCase ...Error
    assert rules.exception("Traceback") is None and rules.exception("ERROR") is None
    assert rules.exception("Error") is None


def test_extra_file_overrides_xid_and_disables_and_adds_signatures(tmp_path):
    extra = _write(tmp_path, """
        [xid.92]
        kind = "drain"

        [[signature]]
        id = "nan_loss"
        enabled = false

        [[signature]]
        id = "site_lustre_evicted"
        category = "storage"
        keyword = "evicted by"
        pattern = 'LustreError: .* evicted by (?P<node>\\S+)'
        priority = 58
        sources = ["kmsg", "log"]

        [[signature]]
        id = "cuda_oom"
        priority = 66
    """)
    rules = load_rules(extra_paths=[extra])
    assert rules.sources[-1] == str(extra)
    assert rules.xid(92).kind is XidKind.DRAIN
    assert "nan_loss" not in {s.rule.id for s in rules.signatures}
    oom = next(s for s in rules.signatures if s.rule.id == "cuda_oom")
    assert oom.rule.priority == 66 and oom.rule.category is Category.OOM_GPU  # key-by-key update
    lustre = LogTail(source="n4", kind="kmsg", text="LustreError: 11-0: scratch-OST0003: evicted by mds01")
    assert classify(Evidence(logs=(lustre,)), rules).category is Category.STORAGE
    nan = LogTail(source=0, text="step 10 loss nan")
    assert classify(Evidence(logs=(nan,)), rules).category is Category.UNKNOWN  # rule disabled
    assert classify(Evidence(logs=(nan,))).category is Category.NUMERICAL  # shipped rules untouched


def test_site_config_rules_files_and_inline_tables(tmp_path):
    extra = _write(tmp_path, """
        [category.user_code]
        recoverable = true
        action = "requeue"
    """, "rules.d.toml")
    site = SiteConfig(sections={"classify": {"rules_files": [str(extra)], "job_state": {"TIMEOUT": {"action": "stop"}}}},
                      source="/etc/slurm-ft/config.toml")
    rules = load_rules(site_config=site)
    assert rules.sources == (str(SHIPPED_RULES), str(extra), "/etc/slurm-ft/config.toml [classify]")
    assert rules.policy(Category.USER_CODE).action is Action.REQUEUE
    verdict = classify(Evidence(job=JobEnd(state="TIMEOUT")), rules)
    assert verdict.category is Category.TIME_LIMIT and verdict.action is Action.STOP


@pytest.mark.parametrize("text, needle", [
    ("[xid.79]\nkind = \"explode\"\n", "[xid.79] kind: 'explode' is not one of"),
    ("[xid.abc]\nkind = \"drain\"\n", "[xid.abc]: key must be a number"),
    ("[category.hardware_gpu]\nrecoverable = true\naction = \"reboot\"\n", "[category.hardware_gpu] action: 'reboot'"),
    ("[category.bogus]\nrecoverable = true\naction = \"stop\"\n", "[category.bogus]: unknown category"),
    ("[job_state.FINISHED]\ncategory = \"unknown\"\n", "[job_state.FINISHED]: unknown Slurm job state"),
    ("[node_state.down]\ncategory = \"unknown\"\n", "[node_state.down]"),
    ("[signal.9]\ncategory = \"unknown\"\npriority = 101\n", "[signal.9] priority: must be within 0..100"),
    ("[signal.9]\ncategory = \"unknown\"\nconfidence = \"high\"\n", "[signal.9] confidence: must be"),
    ("[exception.KeyError]\ncategory = \"user_code\"\nsevere = true\n", "unknown key 'severe'"),
    ("[limits]\nmax_tail_chars = 0\n", "[limits] max_tail_chars: bad value 0"),
    ("[nvml]\nremap_pending = \"yes\"\n", "[nvml] remap_pending: bad value"),
    ("[rules]\nx = 1\n", "unknown key 'rules'"),
    ("[[signature]]\ncategory = \"network\"\n", "signature[0]: missing key 'id'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a('\nkeyword = \"a\"\n", "[signature.x] pattern: bad regex"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a*'\nkeyword = \"a\"\n", "matches the empty string"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'abc'\n", "[signature.x]: missing key 'keyword'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = '(?P<who>a)'\nkeyword = \"a\"\n", "named group 'who'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a'\nkeyword = \"a\"\nsources = [\"stdout\"]\n", "sources"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a'\nkeyword = [\"\"]\n", "keyword: must be a non-empty"),
    ("signature = 3\n", "[[signature]] must be an array of tables"),
])
def test_malformed_rules_name_file_and_key(tmp_path, text, needle):
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(ConfigError) as err:
        load_rules(extra_paths=[path])
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_unreadable_or_invalid_rules_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rules(extra_paths=[tmp_path / "missing.toml"])
    bad = _write(tmp_path, "[xid\n", "broken.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_rules(extra_paths=[bad])
    site = SiteConfig(sections={"classify": {"rules_files": "x.toml"}}, source="site.toml")
    with pytest.raises(ConfigError, match=r"site.toml \[classify\]: rules_files must be a list"):
        load_rules(site_config=site)


def test_category_table_must_stay_complete():
    with pytest.raises(ConfigError, match="lacks"):
        build_rules([("only.toml", {"category": {"network": {"recoverable": True, "action": "requeue"}}})])


# ---- issue 33: signals read for what they mean, each on a literal real line (source in the comment) ------------

def _log(text, rank=0, kind="log", source=None):
    return LogTail(source=rank if source is None else source, text=text, kind=kind)


def _verdict(*tails, job=None):
    return classify(Evidence(job=job, logs=tuple(tails)))


SLURM_LINES = [
    # Slurm 25.11.7 src/slurmd/slurmstepd/req.c (format "*** %s ON %s CANCELLED AT %s DUE to SIGNAL %s ***")
    ("slurmstepd: error: *** JOB 4242 ON n1 CANCELLED AT 2026-12-05T10:00:00 DUE to SIGNAL Terminated ***",
     Category.CANCELLED),
    # Slurm 25.11.7 src/slurmd/slurmd/req.c ("%pI prolog failed status=%d:%d")
    ("slurmd: error: JobId=4242 prolog failed status=1:0", Category.HARDWARE_NODE),
    # Slurm 25.11.7 src/slurmctld/node_mgr.c ("Nodes %s not responding, setting DOWN")
    ("slurmctld: error: Nodes n3 not responding, setting DOWN", Category.HARDWARE_NODE),
    # https://github.com/stas00/ml-engineering/blob/master/orchestration/slurm/users.md
    ("srun: error: Unable to create step for job 1930: Invalid generic resource (gres) specification", Category.CONFIG),
    # https://github.com/huggingface/m4-logs ... is held back: the node-failure line below is Slurm's own format
    # (src/slurmd/slurmstepd/req.c "... DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")
    ("slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-12-05T10:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG "
     "FOR DETAILS ***", Category.HARDWARE_NODE),
]


@pytest.mark.parametrize("line,category", SLURM_LINES)
def test_slurm_lines_mean_what_slurm_says(line, category):
    assert _verdict(_log(line, source="n1")).category is category


def test_slurm_task_failure_teardown_never_decides():
    # Slurm 25.11.7 src/slurmd/slurmstepd/req.c ("... DUE TO TASK FAILURE ***"): the step ends because a task failed
    teardown = "slurmstepd: error: *** STEP 4242.0 ON n1 CANCELLED AT 2026-12-05T10:00:00 DUE TO TASK FAILURE ***"
    assert _verdict(_log(teardown, source="n1")).confidence <= 0.3
    assert _verdict(_log(teardown, source="n1"), _log("KeyError: 'optimiser'", rank=2)).category is Category.USER_CODE


def test_launch_failed_requeued_held_is_the_node():
    # Slurm 25.11.7 src/slurmctld/job_mgr.c: the state reason of a batch job whose launch (prolog) failed
    verdict = classify(Evidence(job=JobEnd(state="PENDING", reason="launch failed requeued held")))
    assert verdict.category is Category.HARDWARE_NODE and verdict.recoverable


CONFIG_LINES = [
    # https://github.com/bigscience-workshop/bigscience/blob/master/train/tr8b-104B/chronicles.md
    "AssertionError: AnnealingLR: class input value 1e-06 and checkpointvalue 1e-05 for minimum learning rate do not "
    "match",
    # NVIDIA/nccl src/init.cc ("Mismatched NCCL version detected : rank %d version %d rank %d version %d")
    "n1:1201:1290 [0] init.cc:1043 NCCL WARN Mismatched NCCL version detected : rank 0 version 22105 rank 8 version "
    "21805",
    # NVIDIA/nccl src/init.cc ("NCCL library is too old. This application was compiled with NCCL version %s, ...")
    "n1:77:77 [0] NCCL WARN NCCL library is too old. This application was compiled with NCCL version 2.21.5, but is "
    "running with NCCL 2.18.1",
    # NVIDIA/nccl src/enqueue.cc ("No algorithm/protocol available for function %s with datatype %s.%s%s")
    "n1:3301:3301 [0] enqueue.cc:2063 NCCL WARN No algorithm/protocol available for function Broadcast with datatype "
    "ncclInt8. NCCL_ALGO was set to NVLS.",
    # NVIDIA/nccl src/plugin/net.cc ("Failed to initialize any NET plugin")
    "n1:5120:5120 [0] net.cc:349 NCCL WARN Failed to initialize any NET plugin",
    # pytorch c10/cuda ("The NVIDIA driver on your system is too old (found version %d)")
    "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver",
    # libnvidia-container's driver gate, as posted in many deployment notes (e.g. docker run on an older driver)
    "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please update your driver to a newer "
    "version, or use an earlier cuda container",
    # CUDA runtime error string of cudaErrorCompatNotSupportedOnDevice
    "RuntimeError: CUDA error: forward compatibility was attempted on non supported HW",
]


@pytest.mark.parametrize("line", CONFIG_LINES)
def test_versions_plugins_drivers_and_containers_are_config(line):
    verdict = _verdict(_log(line))
    assert verdict.category is Category.CONFIG and not verdict.recoverable


def test_a_missing_net_plugin_info_line_is_not_an_error():
    # https://github.com/bigscience-workshop/bigscience/blob/master/experiments/bandwidth/all_reduce_bench-a100-n4.txt
    # (a run that worked: NCCL falls back to its own transports)
    info = ("jean-zay-iam37:261379:261379 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal "
            "implementation")
    assert _verdict(_log(info)).category is Category.UNKNOWN


def test_an_xid_line_anywhere_means_what_the_table_says():
    # https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/nvidia/debug.md: a row remap pending
    # until a GPU reset (the same state as NVML's remap_pending): drain-class, in a job's log only the job's word
    remap = ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to "
             "activate.")
    assert xid_info(63).kind_for(remap) is XidKind.DRAIN
    verdict = _verdict(_log(remap))
    assert verdict.category is Category.HARDWARE_GPU and verdict.recoverable and verdict.attested_nodes == ()
    node = _verdict(_log(remap, kind="kmsg", source="n4"))
    assert node.category is Category.HARDWARE_GPU and node.attested_nodes == ("n4",)
    # https://www.abhik.ai/articles/gpu-xid31-mmu-faults: the application's own MMU fault, not the GPU
    mmu = ("NVRM: Xid (PCI:0000:c1:00): 31, pid=2646416, name=python, channel 0x0000001a, intr 00000000. MMU Fault: "
           "ENGINE GRAPHICS GPC10 GPCCLIENT_T1_5 faulted @ 0x725f_fb800000. Fault is of type FAULT_PDE "
           "ACCESS_TYPE_VIRT_READ")
    verdict = _verdict(_log(mmu, source="n9"))
    assert verdict.category is Category.USER_CODE and verdict.culprit.nodes == ()


def test_an_oom_in_the_first_barrier_is_not_the_jobs_size():
    # https://github.com/bigscience-workshop/bigscience/blob/master/train/tr1-13B-base/chronicles.md (a bad GPU)
    text = ('  File "/gpfswork/rech/six/commun/conda/tr1-13B/lib/python3.8/site-packages/torch/distributed/'
            'distributed_c10d.py", line 2420, in barrier\n    work = default_pg.barrier(opts=opts)\n'
            "RuntimeError: CUDA error: out of memory")
    verdict = _verdict(_log(text))
    assert verdict.category is Category.UNKNOWN and verdict.recoverable and verdict.confidence < 0.5
    assert _verdict(_log("RuntimeError: CUDA error: out of memory")).category is Category.OOM_GPU


def test_a_bare_exception_type_is_never_a_confident_verdict():
    verdict = _verdict(_log("Traceback (most recent call last):\nKeyError: 'optimiser'"))
    assert verdict.category is Category.USER_CODE and verdict.confidence < 0.7


# ---- issue 33, batch 2: set-up, network and numerical lines from documentation of real incidents -----------------
# (repository, file and line of the commit the corpus case pins; the case's [source] has the full URL)

DOCUMENTED_LINES = [
    # argonne-lcf/user-guides@7d04a3f docs/polaris/data-science/frameworks/jax.md L30
    ("jaxlib.xla_extension.XlaRuntimeError: UNKNOWN: no kernel image is available for execution on the device",
     Category.CONFIG),
    # olcf/olcf-user-docs@2745903 systems/frontier_user_guide.rst L3884
    ('"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"', Category.CONFIG),
    # argonne-lcf/user-guides@7d04a3f docs/polaris/data-science/frameworks/pytorch.md L62
    ("RuntimeError: CUDA tensor detected and the MPI used doesn't have CUDA-aware MPI support", Category.CONFIG),
    # NVIDIA/nccl@5067397 docs/userguide/source/troubleshooting/networking_troubleshooting.rst L230, L236, L303
    ("NCCL WARN Call to ibv_create_qp failed", Category.CONFIG),
    ("NCCL WARN Call to ibv_reg_mr failed", Category.CONFIG),
    ("NCCL WARN Call to ibv_modify_qp failed with error Invalid argument", Category.CONFIG),
    # NVIDIA/nccl@5067397 docs/userguide/source/troubleshooting/runtime_and_mpi_issues.rst L39, L59, L217, L240
    ("NCCL WARN Error: failed to extend /dev/shm/nccl-03v824 to 4194660 bytes", Category.CONFIG),
    ("NCCL WARN unlink shared memory /dev/shm/nccl-d5rTd0 failed, error: No such file or directory", Category.CONFIG),
    ("PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c", Category.CONFIG),
    ("UCX  ERROR   no active messages transport to <no debug data>: Unsupported operation", Category.CONFIG),
    # NVIDIA/nccl@5067397 docs/userguide/source/troubleshooting/performance_and_tuning.rst L86
    ("transport/p2p.cc:XXX NCCL WARN Cuda failure 800 'operation not permitted'", Category.CONFIG),
    # argonne-lcf/user-guides@7d04a3f docs/aurora/known-issues.md L149, L111
    ("start failed on x4102c5s2b0n0: No VNIs available in internal allocator", Category.CONFIG),
    (("libfabric:16642:1701636928::cxi:core:cxip_cq_eq_progress():531<warn> x4204c1s3b0n0: Cassini Event Queue "
      "overflow detected."), Category.NETWORK),
    # olcf/olcf-user-docs@2745903 software/analytics/pytorch_frontier.rst L840, L847
    (("MPICH ERROR: Unable to use a NIC_POLICY of 'NUMA'. Rank 4 is not confined to a single NUMA node.  There are 4 "
      "numa_nodes detected (rc=0)."), Category.CONFIG),
    ("MPIDI_CRAY_ofi_get_nic_index(1801)....: OFI invalid value for environment variable", Category.CONFIG),
    # docs.linaroforge.com/24.1.3 .../known_issues/slurm_support.html (Slurm 21.08.0-21.08.4)
    ("Invalid generic resource (gres) specification", Category.CONFIG),
    # nesi/support-docs@16ba8d4 docs/Software/Available_Applications/OpenFOAM.md L63
    ("slurmstepd: error: couldn't chdir to `/var/spool/slurm/jobXXXX': No such file or directory", Category.CONFIG),
    # olcf/olcf-user-docs@2745903 systems/summit_user_guide.rst L3888
    (("CUDA Hook Library: Failed to find symbol mem_find_dreg_entries, ./a.out: undefined symbol: "
      "__PAMI_Invalidate_region"), Category.CONFIG),
    # rcc-uchicago/user-guide@def4294 docs/software/apps-and-envs/alphafold.md L183
    ("implementation='triton' for FlashAttention is unsupported on this GPU generation.", Category.CONFIG),
    # Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp (TORCH_CHECK(is_sm90 || is_sm8x, "..."))
    ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.", Category.CONFIG),
    # argonne-lcf/user-guides@7d04a3f docs/aurora/known-issues.md L141
    (("x1921c1s4b0n0.hostmgmt2000.cm.americas.sgi.com 0: The device does not have the ext_intel_free_memory aspect "
      "-33 (PI_ERROR_INVALID_DEVICE)"), Category.CONFIG),
    # stas00/ml-engineering@744d01e debug/pytorch.md L1981 (transformers' DebugUnderflowOverflow)
    ("Detected inf/nan during batch_number=0", Category.NUMERICAL),
    # owencqueen/PolymerGNN@c0345c1 formal/log_ablation/outputs/iv/fold=0.e L38
    ("ValueError: Input contains NaN, infinity or a value too large for dtype('float64').", Category.NUMERICAL),
    # bigscience-workshop/bigscience@9e64ede train/fixes.md L48-L50
    ("error: invalid object 100644 e69f03783ce2b0af675405f22b49ebeb56d907e5 for '.gitattributes'", Category.STORAGE),
]


@pytest.mark.parametrize("line,category", DOCUMENTED_LINES)
def test_documented_setup_network_and_numerical_lines(line, category):
    verdict = _verdict(_log(line))
    assert verdict.category is category
    assert verdict.recoverable is (category is Category.NETWORK)


def test_a_failed_memory_registration_is_the_setup_not_the_disk():
    # ARCHER2-HPC/archer2-docs@7a5396d docs/known-issues/index.md L94-L96: UCX reports the failed registration
    # (memlock) as "Input/output error" on the next lines
    text = ("[1613401128.440695] [nid001192:11838:0] ib_md.c:325 UCX ERROR ibv_reg_mr(address=0xabcf12c0, "
            "length=26400, access=0xf) failed: Cannot allocate memory\n"
            "[1613401128.440768] [nid001192:11838:0] ucp_mm.c:137 UCX ERROR failed to register address 0xabcf12c0 "
            "mem_type bit 0x1 length 26400 on md[4]=mlx5_0: Input/output error (md reg_mem_types 0x15)")
    verdict = _verdict(_log(text))
    assert verdict.category is Category.CONFIG and not verdict.recoverable
    # other ibv_modify_qp errors are not read as set-up
    assert _verdict(_log("NCCL WARN Call to ibv_modify_qp failed with error Connection timed out")).category \
        is not Category.CONFIG


def test_a_chdir_failure_yields_to_a_later_error():
    # nesi/support-docs@16ba8d4 docs/Software/Available_Applications/OpenFOAM.md L63: Slurm still runs the job (in
    # /tmp), so an error of the run decides
    chdir = "slurmstepd: error: couldn't chdir to `/var/spool/slurm/jobXXXX': No such file or directory"
    verdict = _verdict(_log(chdir + "\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert verdict.category is Category.OOM_GPU
    assert _verdict(_log(chdir)).confidence < 0.7
