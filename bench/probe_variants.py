#!/usr/bin/env python3
"""Builds gpuscope variants whose launch probe leaves a part out, for bench/gpu/probe_parts.py's
--gpuscope-b: what each part of the real program costs, measured in the real workload. The
variants record less (or wrongly): they are for measuring only, never for use.

    python3 bench/probe_variants.py --build /tmp/bs --out build-static

  nomarks  driver launches do not look up the thread's marks (later lookups and runtime
           launches' marks are never read)
  nodata   nomarks, and the record carries no arguments, deref or thread name
  noquery  nodata, and the record is submitted without the wake-up check

Each is built in --build (a configured build tree, e.g. the static one) from an edited copy of
bpf/calls.bpf.c (the launch probe), which is restored afterwards, and copied to OUT/gpuscope-NAME."""
import argparse
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bpf" / "calls.bpf.c"

NOMARKS = [("\t} else if (GS_COOKIE_DRV_LAUNCH(cookie)) {",
            "\t} else if (GS_COOKIE_DRV_LAUNCH(cookie) && !self_tgid) {")]
NODATA = NOMARKS + [("""\tread_args(ctx, r->args);
\tr->deref_len = GS_COOKIE_ENTRY_ARG(cookie) ? read_entry_deref(cookie, r->args, r->deref, &r->flags, GS_DEREF_LEN) : 0;
\tr->stack_weight = stack_weight;
\tr->py_stack = st.py;
\tr->native_stack = st.native;
\tbpf_get_current_comm(r->comm, sizeof(r->comm));""", """\tr->deref_len = 0;
\tr->stack_weight = stack_weight;
\tr->py_stack = st.py;
\tr->native_stack = st.native;""")]
NOQUERY = NODATA + [("""\tr->native_stack = st.native;
\tbpf_ringbuf_submit(r, submit_flags());
\treturn 0;
}

/* Calls whose result matters""", """\tr->native_stack = st.native;
\tbpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
\treturn 0;
}

/* Calls whose result matters""")]
VARIANTS = {"nomarks": NOMARKS, "nodata": NODATA, "noquery": NOQUERY}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="a configured build tree")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    original = SOURCE.read_text()
    try:
        for name in args.variants.split(","):
            text = original
            for old, new in VARIANTS[name]:
                if old not in text:
                    raise SystemExit(f"probe_variants: {name}: the launch probe has changed; update this script")
                text = text.replace(old, new)
            SOURCE.write_text(text)
            subprocess.run(["make", "-C", args.build, "-j2", "gpuscope"], check=True, stdout=subprocess.DEVNULL)
            shutil.copy(pathlib.Path(args.build) / "gpuscope", pathlib.Path(args.out) / f"gpuscope-{name}")
            print(f"probe_variants: {args.out}/gpuscope-{name}")
    finally:
        SOURCE.write_text(original)
        subprocess.run(["make", "-C", args.build, "-j2", "gpuscope"], check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
