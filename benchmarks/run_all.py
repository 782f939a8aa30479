"""Every benchmark in one run on one Synapse: one table, its JSON, two charts.

    python benchmarks/run_all.py            # the issue's figures (takes a while)
    python benchmarks/run_all.py --quick    # smaller counts, a few minutes

Each figure is printed beside its reference, measured in the same run on the
same homeserver: judging beside ``json.loads`` of the same events; send ->
durable beside a bare client seeing the event (bot and appservice mode);
catch-up beside a bare client syncing through the same backlog; posting,
memory and start-up beside the same bridge with nothing to do; an answer
written into a large ``answers.json`` beside the bare atomic replace.

Writes ``benchmarks/out/results.json``, ``latency.png`` and ``catchup.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import catchup  # noqa: E402
import judge as judge_bench  # noqa: E402
import latency  # noqa: E402
import scale  # noqa: E402
from _world import world  # noqa: E402

from bridge.protocol.judge import Accepted, IncomingAnswer  # noqa: E402

OUT = HERE / "out"

TARGETS = {
    "judge_per_s": 20_000, "overhead_p50_ms": 5.0, "overhead_p99_ms": 20.0, "catchup_ratio": 1.5,
    "rss_mb": 120.0, "startup_s": 2.0,
}


def judge_figures(seconds: float) -> dict[str, Any]:
    cases = judge_bench.load_cases()
    items = [(q, IncomingAnswer.from_event(json.loads(data)), ctx) for q, data, ctx in cases]
    accepted = [it for it in items if isinstance(judge_bench.judge(*it), Accepted)]
    accepted_raw = [json.dumps({"content": a.content}).encode() for _q, a, _c in accepted]
    return {
        "events": len(items), "accepted_events": len(accepted),
        "json_loads_per_s": round(judge_bench.rate(judge_bench.parse_all([d for _, d, _ in cases]), seconds)),
        "judge_mix_per_s": round(judge_bench.rate(judge_bench.judge_all(items), seconds)),
        "json_loads_accepted_per_s": round(judge_bench.rate(judge_bench.parse_all(accepted_raw), seconds)),
        "judge_accepted_per_s": round(judge_bench.rate(judge_bench.judge_all(accepted), seconds)),
        "parse_and_judge_mix_per_s": round(judge_bench.rate(judge_bench.parse_and_judge(cases), seconds)),
    }


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"nproc": os.cpu_count(), "cpu": model, "ram_gb": round(mem_kb / 1024 / 1024, 1),
            "python": platform.python_version(), "load_before": os.getloadavg()[0]}


async def synapse_figures(args: argparse.Namespace) -> dict[str, Any]:
    async with world(appservice=True) as w:
        print(f"latency: {args.latency} answers per mode ...", flush=True)
        rows = [await latency.measure(w, mode, args.latency, {}) for mode in ("bot", "appservice")]
        latency.print_table(rows)
        print(f"catch-up: {args.answers} answers ...", flush=True)
        catch = await catchup.measure(w, args.answers)
        catchup.print_row(catch)
        print(f"scale: {args.sets} sets of {args.questions} questions ...", flush=True)
        big = await scale.measure(w, args.sets, args.questions)
    return {"latency": rows, "catchup": catch, "scale": big}


def met(ok: bool) -> str:
    return "yes" if ok else "NO"


def table(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(measure, bridge, reference, target, met) rows."""
    j, c, s = r["judge"], r["catchup"], r["scale"]
    rows = [
        ("judge, answers per second per core (corpus mix)", f"{j['judge_mix_per_s']:,}",
         f"json.loads {j['json_loads_per_s']:,}", ">= 20,000", met(j["judge_mix_per_s"] >= TARGETS["judge_per_s"])),
        ("judge, accepted answers per second per core", f"{j['judge_accepted_per_s']:,}",
         f"json.loads {j['json_loads_accepted_per_s']:,}", ">= 20,000",
         met(j["judge_accepted_per_s"] >= TARGETS["judge_per_s"])),
    ]
    for lat in r["latency"]:
        for p in (50, 99):
            limit = TARGETS[f"overhead_p{p}_ms"]
            rows.append((f"send -> durable, {lat['mode']} mode, p{p} (ms)", f"{lat[f'bridge_p{p}_ms']}",
                         f"bare client {lat[f'bare_p{p}_ms']} (+{lat[f'overhead_p{p}_ms']})",
                         f"+<= {limit:g}", met(lat[f"overhead_p{p}_ms"] <= limit)))
    rows.append((f"catch-up, {c['answers']:,} answers sent while stopped (s)", f"{c['bridge_s']}",
                 f"bare client {c['bare_s']} ({c['ratio']}x)", "<= 1.5x", met(c["ratio"] <= TARGETS["catchup_ratio"])))
    rows.append((f"post {s['questions']:,} questions of {s['sets']:,} sets (s)", f"{s['post_s']}",
                 f"bare client, {s['sends']:,} sends {s['bare_equiv_s']}", "-", "-"))
    rows.append((f"... an answer sent meanwhile, durable after (ms; {s['posted_when_answered']:,} posted by then)",
                 f"{s['answer_during_posting_ms']}", "-", "-", "-"))
    rows.append((f"resident memory, {s['sets']:,} open sets (MB)", f"{s['rss_after_restart_mb']}",
                 f"no set {s['rss_empty_mb']}", "<= 120", met(s["rss_after_restart_mb"] <= TARGETS["rss_mb"])))
    rows.append(("resident memory right after posting them (MB)",
                 f"{s['rss_mb']}", f"no set {s['rss_empty_mb']}", "<= 120", met(s["rss_mb"] <= TARGETS["rss_mb"])))
    rows.append((f"start-up, {s['questions']:,} recorded questions (s)", f"{s['startup_s']}",
                 f"empty store {s['startup_empty_s']}", "<= 2", met(s["startup_s"] <= TARGETS["startup_s"])))
    for g in r["answers_growth"]:
        rows.append((f"one answer into answers.json of {g['records']:,} records (ms)", f"{g['write_ms']}",
                     f"bare atomic replace {g['bare_replace_ms']}", "-", "-"))
    return rows


def render(rows: list[tuple[str, str, str, str, str]]) -> str:
    header = ("measure", "bridge", "reference (same run)", "target", "met")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(5)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def charts(r: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, axes = plt.subplots(1, len(r["latency"]), figsize=(11, 4), sharey=True)
    for ax, lat in zip(axes, r["latency"]):
        for label, key in (("bridge: durable in answers.json", "bridge_ms"), ("bare nio client: event seen", "bare_ms")):
            values = sorted(lat["samples"][key])
            ax.plot(values, [(n + 1) / len(values) for n in range(len(values))], label=label)
        ax.set_title(f"{lat['mode']} mode, {lat['measured']} answers")
        ax.set_xlabel("ms from the person's send")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of answers")
    axes[0].legend(loc="lower right")
    fig.suptitle("Send -> durable, beside a bare client on the same Synapse")
    fig.tight_layout()
    made.append(OUT / "latency.png")
    fig.savefig(made[-1], dpi=110)
    plt.close(fig)

    c = r["catchup"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, key in (("bridge: answers durable", "bridge_curve"), ("bare nio client: answers seen", "bare_curve")):
        points = c[key]
        ax.step([t for t, _ in points], [n for _, n in points], where="post", label=label)
    ax.set_xlabel("seconds from process start")
    ax.set_ylabel("answers")
    ax.set_title(f"Catching up on {c['answers']:,} answers sent while stopped")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    made.append(OUT / "catchup.png")
    fig.savefig(made[-1], dpi=110)
    plt.close(fig)
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts: a check that everything runs")
    parser.add_argument("--latency", type=int, help="answers per mode (200; quick 50)")
    parser.add_argument("--answers", type=int, help="catch-up backlog (5000; quick 1000)")
    parser.add_argument("--sets", type=int, help="sets for the scale run (1000; quick 100)")
    parser.add_argument("--questions", type=int, default=10, help="questions per set (10)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each timed judge round")
    parser.add_argument("--from-json", action="store_true",
                        help="print the table (and redraw the charts) of the last run's results.json")
    args = parser.parse_args()
    if args.from_json:
        results = json.loads((OUT / "results.json").read_text())
        results["table"] = [dict(zip(("measure", "bridge", "reference", "target", "met"), row))
                            for row in table(results)]
        (OUT / "results.json").write_text(json.dumps(results, indent=2))
        charts(results)
        print(render(table(results)))
        return 0
    args.latency = args.latency or (50 if args.quick else 200)
    args.answers = args.answers or (1000 if args.quick else 5000)
    args.sets = args.sets or (100 if args.quick else 1000)

    OUT.mkdir(exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    print("judge ...", flush=True)
    results["judge"] = judge_figures(args.seconds)
    results.update(asyncio.run(synapse_figures(args)))
    print("answers.json growth ...", flush=True)
    results["answers_growth"] = scale.answers_growth()
    results["seconds"] = round(time.monotonic() - started)
    rows = table(results)
    results["table"] = [dict(zip(("measure", "bridge", "reference", "target", "met"), row)) for row in rows]
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    made = charts(results)
    m = results["machine"]
    print()
    print(f"{m['nproc']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, Python {m['python']}; "
          f"{'quick run' if args.quick else 'full run'} in {results['seconds']} s")
    print(render(rows))
    print(f"\nwritten: {OUT / 'results.json'}, " + ", ".join(str(p) for p in made))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
