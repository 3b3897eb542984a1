"""Compare two tracecap files (see tests/support/tracecap.py): which runs differ."""
import pickle, sys


def main(old, new):
    a, b = (pickle.load(open(p, "rb")) for p in (old, new))
    common = a.keys() & b.keys()
    bad = [k for k in sorted(common, key=str) if a[k] != b[k]]
    print(f"runs: old {len(a)} new {len(b)} common {len(common)} differing {len(bad)}")
    for k in bad[:10]:
        print(k, {f: (a[k].get(f), b[k].get(f)) for f in a[k] if a[k].get(f) != b[k].get(f)})
    print(f"only in the first: {len(a.keys() - b.keys())}, only in the second: {len(b.keys() - a.keys())}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
