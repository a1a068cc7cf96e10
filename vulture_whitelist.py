"""What vulture (make lint) cannot see used: each name here is used dynamically, as its comment says."""

# ruff: noqa: B018
from pipeplan.cli import _root  # typer calls it: the app's callback (@app.callback)
from pipeplan.cli.show_cmd import show_cluster, show_clusters, show_profile, show_profiles  # typer commands (@show_app.command)
from pipeplan.cli.trace_cmd import markov, periodic, replay  # typer commands (@trace_app.command)
from pipeplan.core import __getattr__ as core_getattr  # Python calls a module's __getattr__ (PEP 562) for lazy names
from pipeplan.runtime.training.launch import watch_launcher  # named in train's WORKER_BOOT code, run with python -c

_root, show_cluster, show_clusters, show_profile, show_profiles, markov, periodic, replay, core_getattr, watch_launcher

# numpy reads it: `array.flags.writeable = False` makes the link matrices read-only (core/hardware/links.py)
_ = object()
_.writeable

# torch calls these with its own argument names: __torch_function__(func, types, args, kwargs) in
# profiler/attention.py, scaled_dot_product_attention's keyword dropout_p, and the FLOP counter's handlers with
# out_shape and grad_out in profiler/flops.py
_.types
_.dropout_p
_.out_shape
_.grad_out

# adapt/ is being tuned on the adapt2 branch (only its import lines change here): its row order of policies is
# that branch's to use or drop
from pipeplan.adapt.fixed_baselines import POLICY_ORDER  # noqa: E402

POLICY_ORDER

# pytest reads these: a module's `pytestmark` (its markers) and autouse fixtures, which no test names
_.pytestmark
_.one_torch_thread  # tests/conftest.py, named in usefixtures by test_profiler and test_profiler_graph
_.no_work  # tests/test_api_arguments.py, named in usefixtures by the sweep over every API argument
_.one_process  # tests/test_api_distributed.py: a process group of this process alone, named in usefixtures
_._no_blocking  # tests/test_io.py
_.full_folder_fixture  # tests/full_disk.py: the fixture full_folder (by its name=), imported by the disk-full tests
# torch.distributed.pipelining's CSV loader reads it from the stub stage in tests/test_schedule_io.py
_.group_rank

# Python calls a module's __dir__ (PEP 562) for dir(pipeplan), beside __getattr__'s lazy API names
_.__dir__
# torch.nn.Module's repr calls extra_repr (models/traced/graph.py's traced layers)
_.extra_repr
# the local job's worker is started from a code string (runtime/training/local_jobs.WORKER)
_.worker_main
# pipeplan.api.LocalRun is a public result: callers read its memory fields
_.predicted_memory_bytes
_.measured_memory_bytes

# runtime.transport.launch_env.LaunchEnv: the rendezvous address a process joins, checked and kept with its rank
# (tests compare the whole value; torch.distributed reads the same variables itself)
_.master_addr
_.master_port

# pytest finds fixtures by name: test_models_user_code's models_on_path (usefixtures); the HF-style forward signature
# whose second parameter test_user_data's input_name_of test reads
_.models_on_path
_.attention_mask
_.pytest_configure  # tests/conftest.py: a pytest hook (the torch guard under -m "not torch")
_.pytest_pycollect_makemodule  # tests/conftest.py: a pytest hook (torch-marked files not imported under -m "not torch")
_.percent_of_peak  # benchmarks/published_runs.py: a PublishedRun field, read through asdict in --json rows
_.tp_enter  # runtime/execution/tp_layers.py: a split block's submodule its fx graph calls by name (split_graph)
_.sp_scatter  # runtime/execution/sequence_parallel.py: a split graph's sequence hooks, called by name (split_graph)
_.sp_gather  # the same
_.sp_summed  # the same
_.post_attention_layernorm  # tests/test_runtime_sequence_parallel_captured.py: a stock Llama's norm replaced before capture
