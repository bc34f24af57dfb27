"""Running a module as `python -m` would, in a Python where `import vllm`
fails: an editor of an alert threshold, or of a setting, has no inference
engine installed. Pass WITHOUT_VLLM to `python -c`, then the module and its
arguments."""

WITHOUT_VLLM = """
import runpy, sys

class NoVllm:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "vllm":
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoVllm())
module, *sys.argv[1:] = sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
