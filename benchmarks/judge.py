"""How fast answers are judged, beside json.loads of the same events.

    python benchmarks/judge.py [--seconds 0.5]

Single-threaded, so every figure is for one core.  The events are the answer
corpus (fixtures/matrix-events/answers): the seed's valid and refused cases
plus the bridge's own, a mix heavy in refusals; the table also shows the
accepted-only and schema-refused-only slices, since live traffic is mostly
accepted answers.  Each judge call runs both layers (schema, then recorded).
Question events built per second are shown when the question-event builder is
installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bridge.protocol.judge import Accepted, IncomingAnswer, JudgeContext, Refused, judge  # noqa: E402
from bridge.protocol.recorded import RecordedQuestion  # noqa: E402

CORPUS = ROOT / "fixtures" / "matrix-events" / "answers"
TARGET = 20_000

Case = tuple[RecordedQuestion | None, bytes, JudgeContext]


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for name in ("valid.json", "refused.json", "extra.json"):
        for case in json.loads((CORPUS / name).read_text(encoding="utf-8"))["cases"]:
            event = case["question"]
            question = RecordedQuestion.from_event(event, open=case.get("question_open", True)) if event else None
            bridge = event["sender"] if event else "@askwright:example.org"
            given = case.get("context")
            if given:
                allowed = given["allowed"]
                ctx = JudgeContext(None if allowed is None else frozenset(allowed), frozenset(given["members"]), given["bridge_user"])
            else:
                ctx = JudgeContext(None, frozenset({case["answer"]["sender"], bridge}), bridge)
            cases.append((question, json.dumps(case["answer"]).encode("utf-8"), ctx))
    return cases


def rate(work: Callable[[], int], seconds: float) -> float:
    """Items per second, best of five timed rounds (each about ``seconds`` long)."""
    # Warm up: the first call loads and compiles the schema.
    work()
    best = 0.0
    for _ in range(5):
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            done += work()
        best = max(best, done / elapsed)
    return best


def judge_all(items: list[tuple[RecordedQuestion | None, IncomingAnswer, JudgeContext]]) -> Callable[[], int]:
    def work() -> int:
        for question, answer, ctx in items:
            judge(question, answer, ctx)
        return len(items)

    return work


def parse_all(raw: list[bytes]) -> Callable[[], int]:
    def work() -> int:
        for data in raw:
            json.loads(data)
        return len(raw)

    return work


def parse_and_judge(cases: list[Case]) -> Callable[[], int]:
    def work() -> int:
        for question, data, ctx in cases:
            judge(question, IncomingAnswer.from_event(json.loads(data)), ctx)
        return len(cases)

    return work


def question_builder(seconds: float) -> tuple[float, int] | None:
    """Question events built per second from the bundled examples, if the builder exists."""
    try:
        from bridge.protocol.question_event import build_question_event
        from bridge.questionset.model import QuestionSet
        from bridge.resources import examples_dir
    except ImportError:
        return None
    pairs = []
    for path in sorted(examples_dir().glob("*/questions.json")):
        qset = QuestionSet.model_validate(json.loads(path.read_text(encoding="utf-8")))
        for question in qset.open_questions:
            media = {m.src: {"url": "mxc://example.org/media", "mimetype": "application/octet-stream"}
                     for m in question.media or () if m.src}
            pairs.append((qset, question, media))
    if not pairs:
        return None

    def work() -> int:
        for n, (qset, question, media) in enumerate(pairs):
            build_question_event(qset, question, elicitation_id=f"elc_{n}", media=media)
        return len(pairs)

    return rate(work, seconds), len(pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each timed round")
    args = parser.parse_args(argv)

    cases = load_cases()
    items = [(q, IncomingAnswer.from_event(json.loads(data)), ctx) for q, data, ctx in cases]
    verdicts = [judge(q, a, ctx) for q, a, ctx in items]
    accepted = [it for it, v in zip(items, verdicts) if isinstance(v, Accepted)]
    by_schema = [it for it, v in zip(items, verdicts) if isinstance(v, Refused) and v.layer == "schema"]
    by_recorded = [it for it, v in zip(items, verdicts) if isinstance(v, Refused) and v.layer == "recorded"]

    rows: list[tuple[str, int, float]] = [
        ("json.loads of the same answer events", len(cases), rate(parse_all([d for _, d, _ in cases]), args.seconds)),
        ("judge: corpus mix", len(items), rate(judge_all(items), args.seconds)),
        ("judge: accepted answers only", len(accepted), rate(judge_all(accepted), args.seconds)),
        ("judge: refused by the recorded layer only", len(by_recorded), rate(judge_all(by_recorded), args.seconds)),
        ("judge: refused by the schema layer only", len(by_schema), rate(judge_all(by_schema), args.seconds)),
        ("json.loads + judge: corpus mix", len(cases), rate(parse_and_judge(cases), args.seconds)),
    ]
    built = question_builder(args.seconds)
    if built is not None:
        rows.append(("question events built (bundled examples)", built[1], built[0]))

    width = max(len(r[0]) for r in rows)
    print(f"{'workload':<{width}}  {'events':>6}  {'per second (1 core)':>19}")
    print(f"{'-' * width}  {'-' * 6}  {'-' * 19}")
    for label, count, per_second in rows:
        print(f"{label:<{width}}  {count:>6}  {per_second:>19,.0f}")
    mix = rows[1][2]
    print()
    print(f"corpus mix: {len(accepted)} accepted, {len(by_recorded)} refused by recorded, {len(by_schema)} by schema")
    print(f"target {TARGET:,} judged/s: {'met' if mix >= TARGET else 'NOT met'} ({mix:,.0f})")
    if built is None:
        print("question events: builder not installed, not measured")
    return 0 if mix >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
