# Installed in the test roots' sitecustomize only, never in a user's Python: Debian builds torch
# without libuv, while TCPStore asks for libuv by default (clients too), and torch's agent-store
# path (TORCHELASTIC_USE_AGENT_STORE=True, torchrun's and launch's) passes no use_libuv. So
# every TCPStore made in these roots defaults to the classic backend; one that asks for libuv
# explicitly still gets torch's own error. Applied when torch.distributed is first imported, so
# a Python that never imports torch pays nothing.
import importlib.abc
import importlib.machinery
import sys


class _ClassicTCPStore(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            base = module.TCPStore

            class TCPStore(base):
                def __init__(self, *args, **kwargs):
                    kwargs.setdefault("use_libuv", False)
                    super().__init__(*args, **kwargs)

            TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
            # torch.distributed and the modules that took the name while it was importing.
            for mod in list(sys.modules.values()):
                if getattr(mod, "__name__", "").startswith("torch.distributed") and \
                        getattr(mod, "TCPStore", None) is base:
                    mod.TCPStore = TCPStore

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _ClassicTCPStore())
