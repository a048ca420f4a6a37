"""Debian's torchrun (PyTorch 1.13) with its Python 3.11 bug patched, for comparisons only.

PyTorch 1.13's Std.from_str walks `for s in Std`, which on Python 3.11 no longer yields the
flags NONE (0) and ALL (3), so every default launch dies with "'NoneType' object has no
attribute 'get'". This harness maps the values by number instead, then runs torchrun's own
main() unchanged. muster's code does not depend on it.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.fullmatch(r"[0-3]", vm):
        return cls(int(vm))
    if re.fullmatch(r"(\d:[0-3],)*\d:[0-3]", vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} is not a valid --redirects/--tee value")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    # "--legacy" first: python -m torch.distributed.launch instead of torchrun.
    if sys.argv[1:2] == ["--legacy"]:
        del sys.argv[1]
        from torch.distributed.launch import main  # noqa: E402  (after the patch on purpose)
    else:
        from torch.distributed.run import main  # noqa: E402
    sys.exit(main())
