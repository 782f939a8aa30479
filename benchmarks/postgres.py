"""The store on PostgreSQL beside SQLite: send -> durable, and catch-up.

    python benchmarks/postgres.py            # 200 answers per latency run, backlogs of 1000 and 5000
    python benchmarks/postgres.py --quick    # 50, and a backlog of 1000

The same measurements as ``latency.py`` and ``catchup.py``, made on each
backend in one run: SQLite at ``store.path``, and a local PostgreSQL server
(started here, fsync on, as a production server runs) at ``store.url``.
Each row prints the PostgreSQL figure beside the SQLite one; the difference
is what the network round trips to the database cost.

Send -> durable is measured in turns on one homeserver, the store going
first alternating (``TURNS`` of each, the answers split between them), and
each store's turns pooled per answer: two homeservers started one after the
other differ by more than the difference measured (two runs of the earlier
bench put SQLite's per-answer p50 at +0.69 and +4.53 ms).  Each catch-up
is measured in a world of its own, against the bare client in that world.

Writes ``benchmarks/out/postgres.json``; then runs ``slowdb.py`` on the
same server (/health and the agents' API with the database 5 ms further
away), which prints its own table and writes ``benchmarks/out/slowdb.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import catchup  # noqa: E402
import latency  # noqa: E402
from _world import World, world  # noqa: E402

from bridge.devpostgres import Postgres  # noqa: E402

OUT = HERE / "out"
# Send -> durable: turns of each store.  Each turn starts its bridge, and a
# turn's first round can hold the start's own work: few turns, long ones.
TURNS = 2


def store_at(path: Path, url: str, password: str) -> Path:
    """The config at ``path`` with its store at the PostgreSQL database ``url``."""
    data = yaml.safe_load(path.read_text())
    data["store"].update(url=url, password=password)
    path.write_text(yaml.safe_dump(data))
    return path


def on_postgresql(w: World, server: Postgres) -> None:
    """Every config this world writes from now on keeps the store in a new PostgreSQL database."""
    write = w.config

    def config(**kwargs: Any) -> Path:
        return store_at(write(**kwargs), server.create_database(), server.password)

    w.config = config  # type: ignore[method-assign]


STORES = ("SQLite", "PostgreSQL")


async def latency_in_turns(server: Postgres, answers: int, turns: int) -> dict[str, list[dict[str, Any]]]:
    """Each store's send -> durable, per mode, ``answers`` split into ``turns``
    of each store taken in turn on one homeserver; a row per store and mode."""
    taken: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in STORES}
    async with world(appservice=True) as w:
        on_sqlite = w.config
        for mode in ("bot", "appservice"):
            for turn in range(turns):
                for name in STORES if turn % 2 == 0 else STORES[::-1]:
                    w.config = on_sqlite  # type: ignore[method-assign]
                    if name == "PostgreSQL":
                        on_postgresql(w, server)
                    print(f"{name}: latency, {mode} mode, turn {turn + 1} of {turns} ...", flush=True)
                    row = await latency.measure(w, mode, max(5, answers // turns), {}, tag=f"-{name[:2].lower()}{turn}")
                    taken[name].setdefault(mode, []).append(row)
    return {name: [pooled(mode, rows) for mode, rows in modes.items()] for name, modes in taken.items()}


def pooled(mode: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's turns as one row: the per-answer figures over every answer
    but those of each turn's first round, which wait on the start (in
    appservice mode the homeserver backs off from an appservice that was
    away between turns); that round's median is kept beside them."""
    def after_first_round(row: dict[str, Any], key: str) -> list[float]:
        return row["samples"][key][row["samples"]["round_sizes"][0]:]

    bridge = [v for row in turns for v in after_first_round(row, "bridge_ms")]
    bare = [v for row in turns for v in after_first_round(row, "bare_ms")]
    row = latency.summary(mode, bridge, bare, sum(r["answers"] for r in turns))
    row["paired_by_round_ms"] = [v for r in turns for v in r["paired_by_round_ms"][1:]]
    row["first_round_paired_ms"] = [r["paired_by_round_ms"][0] for r in turns]
    row["paired_p50_by_turn_ms"] = [r["paired_p50_ms"] for r in turns]
    return row


async def catch_up(name: str, server: Postgres | None, backlog: int) -> dict[str, Any]:
    async with world(appservice=True) as w:
        if server is not None:
            on_postgresql(w, server)  # catch-up then follows the store at the config's store.url
        print(f"{name}: catch-up, {backlog} answers ...", flush=True)
        return await catchup.measure(w, backlog)


def table(sqlite: dict[str, Any], pg: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, PostgreSQL, SQLite, difference) rows."""
    rows = []
    for lite, post in zip(sqlite["latency"], pg["latency"]):
        for p in (50, 99):
            key = f"bridge_p{p}_ms"
            rows.append((f"send -> durable, {post['mode']} mode, p{p} (ms)", f"{post[key]}", f"{lite[key]}",
                         f"{post[key] - lite[key]:+.2f}"))
            over = f"paired_p{p}_ms"  # per answer, over the bare client's sight of the same answer
            rows.append((f"... over a bare client, per answer, {post['mode']} mode, p{p} (ms)", f"{post[over]:+.2f}",
                         f"{lite[over]:+.2f}", f"{post[over] - lite[over]:+.2f}"))
        by_turn = [f"{a - b:+.2f}" for a, b in zip(post["paired_p50_by_turn_ms"], lite["paired_p50_by_turn_ms"])]
        rows.append((f"... per answer p50 of each turn, {post['mode']} mode (ms)",
                     " ".join(f"{v:+.2f}" for v in post["paired_p50_by_turn_ms"]),
                     " ".join(f"{v:+.2f}" for v in lite["paired_p50_by_turn_ms"]), " ".join(by_turn)))
        rows.append((f"... each turn's first round, left out above, {post['mode']} mode (ms)",
                     " ".join(f"{v:+.2f}" for v in post["first_round_paired_ms"]),
                     " ".join(f"{v:+.2f}" for v in lite["first_round_paired_ms"]), ""))
    for c_lite, c_post in zip(sqlite["catchup"], pg["catchup"]):
        rows.append((f"catch-up, {c_post['answers']:,} answers sent while stopped (s)",
                     f"{c_post['bridge_s']} ({c_post['ratio']}x bare)", f"{c_lite['bridge_s']} ({c_lite['ratio']}x bare)",
                     f"{c_post['bridge_s'] - c_lite['bridge_s']:+.2f}"))
    return rows


def render(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("measure", "PostgreSQL", "SQLite (same run)", "difference")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--latency", type=int, help="answers per mode (200; quick 50)")
    parser.add_argument("--answers", type=int, nargs="+", help="catch-up backlogs (1000 5000; quick 1000)")
    parser.add_argument("--stages", metavar="PREFIX",
                        help="each batch's stages and waits for the database, as latency.py --stages writes them")
    args, _others = parser.parse_known_args()  # make bench passes run_all's flags too
    latency.STAGES = args.stages or ""
    answers = args.latency or (50 if args.quick else 200)
    # Both backlogs the target names: 1,000, where the start-up still weighs, and 5,000.
    backlogs = args.answers or ([1000] if args.quick else [1000, 5000])
    OUT.mkdir(exist_ok=True)
    with Postgres(durable=True) as server:
        rows = asyncio.run(latency_in_turns(server, answers, TURNS))
        sqlite = {"latency": rows["SQLite"], "catchup": [asyncio.run(catch_up("SQLite", None, n)) for n in backlogs]}
        pg = {"latency": rows["PostgreSQL"],
              "catchup": [asyncio.run(catch_up("PostgreSQL", server, n)) for n in backlogs]}
        # Printed and written before slowdb runs: a failure there must not
        # lose the measurements before it.
        report(sqlite, pg)
        import slowdb  # here: slowdb imports this module's helpers

        print("/health and the agents' API with the database 5 ms further away ...", flush=True)
        slowdb.run(server, 20 if args.quick else 60)  # its own table, and benchmarks/out/slowdb.json
    return 0


def report(sqlite: dict[str, Any], pg: dict[str, Any]) -> None:
    rows = table(sqlite, pg)
    for result in (sqlite, pg):
        for row in result["latency"]:
            row.pop("samples", None)
        for catches in result["catchup"]:
            for key in ("bridge_curve", "bare_curve"):
                catches.pop(key, None)
    (OUT / "postgres.json").write_text(json.dumps(
        {"sqlite": sqlite, "postgresql": pg,
         "table": [dict(zip(("measure", "postgresql", "sqlite", "difference"), r)) for r in rows]}, indent=2))
    print(render(rows), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
