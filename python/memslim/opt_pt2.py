"""memslim-opt over torch.export archives: `memslim-opt m.pt2 -o m_opt.pt2 [--remarks] ...`.

What: memslim-opt hands a `.pt2` input to this module (`python -m memslim.opt_pt2 ARGS`):
torch.export.load, memslim.fx.optimize (the C++ decision core, as for TorchScript
input), torch.export.save. The program it writes loads with torch.export.load once memslim
is imported (its memslim ops are registered then), and its `.module()` trains.
Flags: as memslim-opt's where they apply to FX: -o OUT, --passes=a,b or --pipeline=NAME,
--remarks, --stats, the policy flags (from the one policy table). --pipeline=NAME runs the
pipeline's FX steps (the core's pipeline table: `memslim._C.pipeline_passes(NAME, "fx")`);
memslim-default's also run when neither --passes nor --pipeline is given. Errors: one `memslim-opt: error: ...`
line, exit code 1, no output file (written to a temporary name and renamed).
"""

from __future__ import annotations

import os
import sys
import tempfile


def _fail(msg: str) -> "NoReturn":  # noqa: F821
    sys.stderr.write(f"memslim-opt: error: {msg}\n")
    sys.exit(1)


def _pipeline_passes(_C, name: str) -> list:
    """The pass list of pipeline `name` as the FX front end runs it (the core's pipeline
    table: memslim-default is fx_default_passes()); unknown names fail as for
    TorchScript input."""
    try:
        return list(_C.pipeline_passes(name, "fx"))
    except ValueError:
        _fail(f"unknown pipeline '{name}' (see --list-passes)")


def _parse(argv, _C):
    """argv -> (input, output, passes, (remarks, stats), policy); passes None: the default
    list, [] (an empty --passes=): no pass."""
    inp, out, passes, pipeline, remarks, stats, policy = None, None, None, None, False, False, {}
    options = {"--" + name.replace("_", "-"): name for name, _, _ in _C.policy_options()}
    it = iter(argv)
    for a in it:
        if a == "-o":
            out = next(it, None)
            if out is None:
                _fail("-o needs a file name")
        elif a.startswith("--passes="):
            passes = [p for p in a.split("=", 1)[1].split(",") if p]
        elif a.startswith("--pipeline="):
            pipeline = a.split("=", 1)[1]
        elif a == "--remarks":
            remarks = True
        elif a == "--stats":
            stats = True
        elif a.split("=", 1)[0] in options:
            if "=" not in a:
                _fail(f"{a} needs a value ({a}=VALUE)")
            flag, text = a.split("=", 1)
            policy[options[flag]] = _C.parse_policy_value(text)  # as memslim-opt reads flags
        elif a.startswith("-") and a != "-":
            _fail(f"unknown or unsupported option for .pt2 input: {a}")
        elif inp is None:
            inp = a
        else:
            _fail(f"more than one input: {inp}, {a}")
    if inp is None:
        _fail("no input")
    # As for TorchScript input: an empty --passes= / --pipeline= counts as not given.
    if passes and pipeline:
        _fail("give --passes or --pipeline, not both")
    if pipeline:
        passes = _pipeline_passes(_C, pipeline)
    return inp, out, passes, (remarks, stats), policy


def main(argv) -> int:
    try:
        import memslim
        from memslim import _C
    except Exception as e:  # noqa: BLE001
        _fail(f"cannot import memslim: {e}")
    inp, out, passes, (remarks, stats), policy = _parse(argv, _C)
    if not os.path.isfile(inp):
        _fail(f"cannot read {inp}: no such file")
    import torch

    try:
        ep = torch.export.load(inp)
    except Exception as e:  # noqa: BLE001
        _fail(
            f"cannot read {inp} as a torch.export archive: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        )
    try:
        memslim.fx.optimize(ep, passes=passes, **policy)
    except (ValueError, TypeError) as e:
        _fail(str(e).replace("memslim.fx.optimize: ", "").replace("memslim.optimize: ", ""))
    if remarks:
        for d in memslim.report(ep):
            sys.stderr.write(str(d) + "\n")
    if stats:
        sys.stderr.write(memslim.report(ep).stats_text())
    if out is None:
        sys.stdout.write(str(ep.graph_module.graph) + "\n")
        return 0
    fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    try:
        torch.export.save(ep, tmp)
        os.replace(tmp, out)
    except Exception as e:  # noqa: BLE001
        os.unlink(tmp)
        _fail(f"cannot write {out}: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
