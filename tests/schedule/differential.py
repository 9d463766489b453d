"""Differential test of schedule/cron.h against croniter, the reference implementation.

Generates random valid cron expressions (5 and 6 fields, every syntax element, macros) and
random instants from 1970 to 2100 (40% of them within 4 h of a daylight-saving change) in several
zones, plus schedules that run often in the small hours at instants around DST changes; asks
croniter and the cron_next tool for the next run of each, and compares.

Every case must agree unless the difference is one of the EXPLANATIONS below, each a place where
schedule/cron.h deliberately differs (or croniter contradicts itself), and each checked case by
case, not assumed: e.g. for a fall back, croniter's own runs from the same instant with its
second-instant runs removed must begin with ours. Explained cases are counted per explanation
and printed; any other difference fails the test.

Usage: differential.py --tool build/tests/schedule/cron_next --seed N [--cases N] [--dst-cases N]
"""

import argparse
import bisect
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from croniter import croniter
from croniter.croniter import CroniterBadDateError

# UTC and Asia/Kolkata (+05:30 throughout 1970-2100) have no changes; New York and Berlin change
# by an hour on different dates, Lord Howe (southern hemisphere) by 30 minutes.
ZONES = ["UTC", "Asia/Kolkata", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]
FIRST = int(datetime(1970, 1, 1, tzinfo=timezone.utc).timestamp())
LAST = int(datetime(2100, 12, 31, tzinfo=timezone.utc).timestamp())

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
# name, lowest value, highest value written, end of `*` and of `a/n`, names
FIELDS = {
    "second": (0, 59, 59, None),
    "minute": (0, 59, 59, None),
    "hour": (0, 23, 23, None),
    "dom": (1, 31, 31, None),
    "month": (1, 12, 12, MONTHS),
    "dow": (0, 7, 6, DAYS),
}
MACROS = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]


def value_text(rng, field, v):
    names = FIELDS[field][3]
    lo = FIELDS[field][0]
    if names and v - lo < len(names) and rng.random() < 0.3:
        name = names[v - lo]
        return rng.choice([name, name.lower(), name.capitalize()])
    return str(v)


def item(rng, field):
    lo, hi, star_hi, _ = FIELDS[field]
    size = star_hi - lo + 1
    kind = rng.choices(["value", "range", "star_step", "range_step", "start_step"],
                       weights=[4, 3, 2, 2, 1])[0]
    if kind == "value":
        return value_text(rng, field, rng.randint(lo, hi))
    if kind == "star_step":
        return "*/%d" % rng.randint(1, size)
    # Ranges have two different ends: croniter 7.0.0 reads a one-value range such as `5-5` as
    # the whole field (cron_test pins that we read it as 5).
    a = rng.randint(lo, hi - 1)
    b = rng.randint(a + 1, hi)
    if kind == "range":
        return "%s-%s" % (value_text(rng, field, a), value_text(rng, field, b))
    if kind == "range_step":
        return "%s-%s/%d" % (value_text(rng, field, a), value_text(rng, field, b),
                             rng.randint(1, size))
    # `a/n`: a is below the end of the field, so this too is never a one-value range.
    a = rng.randint(lo, star_hi - 1)
    return "%s/%d" % (value_text(rng, field, a), rng.randint(1, size))


def field_text(rng, field, star_chance):
    if rng.random() < star_chance:
        return "*"
    return ",".join(item(rng, field) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def expression(rng):
    if rng.random() < 0.03:
        return rng.choice(MACROS + [m.upper() for m in MACROS])
    fields = [
        field_text(rng, "minute", 0.15),
        field_text(rng, "hour", 0.35),
        field_text(rng, "dom", 0.55),
        field_text(rng, "month", 0.6),
        field_text(rng, "dow", 0.6),
    ]
    if rng.random() < 0.3:
        fields.insert(0, field_text(rng, "second", 0.2))
    return " ".join(fields)


def dense_expression(rng):
    """An expression that runs often in the small hours, when clocks change: for the cases
    placed around DST changes, where a sparse schedule would seldom meet one."""
    low = rng.randint(0, 3)
    hour = rng.choice([
        "*", "*/1", "0-23", "*/2", str(low), "%d-%d" % (low, rng.randint(low + 1, 5)),
        ",".join(str(h) for h in sorted(rng.sample(range(6), rng.randint(2, 4)))),
        item(rng, "hour")])
    minute = rng.choice(["*", "*/%d" % rng.randint(1, 30), str(rng.randint(0, 59)),
                         item(rng, "minute")])
    fields = [minute, hour, field_text(rng, "dom", 0.9), field_text(rng, "month", 0.9),
              field_text(rng, "dow", 0.9)]
    if rng.random() < 0.3:
        fields.insert(0, rng.choice(["0", "*/%d" % rng.randint(1, 30), str(rng.randint(0, 59)),
                                     item(rng, "second")]))
    return " ".join(fields)


def transitions(zone):
    """The UTC instants (unix seconds) at which `zone` changes its offset, 1970-2100."""
    tz = ZoneInfo(zone)
    found = []
    step = 6 * 3600
    t = FIRST
    offset = datetime.fromtimestamp(t, tz).utcoffset()
    while t < LAST:
        u = t + step
        o = datetime.fromtimestamp(u, tz).utcoffset()
        if o != offset:
            lo, hi = t, u  # offset(lo) is the old one, offset(hi) the new one
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if datetime.fromtimestamp(mid, tz).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
            offset = o
        t = u
    return found


def instant(rng, zone_transitions, near_share=0.4):
    if zone_transitions and rng.random() < near_share:
        t = rng.choice(zone_transitions) + rng.randint(-4 * 3600, 4 * 3600)
    else:
        t = rng.randint(FIRST, LAST)
    r = rng.random()
    if r < 0.25:
        t -= t % 60  # on a minute: often exactly on a run
    elif r < 0.35:
        t -= t % 3600
    return t


def croniter_runs(expr, zone, after):
    """croniter's runs strictly after `after` (unix seconds), as an iterator; None at the end."""
    seconds_first = len(expr.split()) == 6
    it = croniter(expr, datetime.fromtimestamp(after, ZoneInfo(zone)),
                  second_at_beginning=seconds_first)
    while True:
        try:
            yield round(it.get_next(float))
        except CroniterBadDateError:
            yield None
            return


def every_hour(expr):
    """The expression's hour field names all 24 hours (as croniter expands it)."""
    seconds_first = len(expr.split()) == 6
    expanded = croniter.expand(expr, second_at_beginning=seconds_first)[0]
    return expanded[1] == ["*"]


def second_instant(t, zone):
    """`t` is the second instant of a wall time that the zone shows twice."""
    local = datetime.fromtimestamp(t, ZoneInfo(zone))
    return local.fold == 1 and local.replace(fold=0).timestamp() != t


def first_run(expr, zone, after):
    return next(croniter_runs(expr, zone, after))


def explain_fall_back(expr, zone, after, ours, theirs):
    """cron.h's rule for a repeated wall time: a schedule whose hour field is restricted runs at
    the first instant only; croniter runs it at both. Explained when removing croniter's
    second-instant runs from its sequence leaves ours first."""
    if theirs is None or every_hour(expr) or not second_instant(theirs, zone):
        return None
    dropped = []
    for run in croniter_runs(expr, zone, after):
        if run is not None and second_instant(run, zone) and len(dropped) < 5000:
            dropped.append(run)
            continue
        if run != ours:
            return None
        shown = [show(d, zone) for d in dropped[:2]]
        more = " and %d more" % (len(dropped) - 2) if len(dropped) > 2 else ""
        return "croniter runs %s%s (second instants); ours %s" % (
            ", ".join(shown), more, show(ours, zone))
    return None


def explain_lord_howe(expr, zone, after, ours, theirs):
    """Where a fall back repeats 30 minutes (Lord Howe), croniter iterating from the first pass
    misses second-instant runs that it gives itself when asked from one second before them
    (croniter's own inconsistency; cron.h runs both instants of an every-hour schedule, as
    croniter does for a one-hour repeat). Explained when croniter from ours - 1 gives ours."""
    if (ours is None or (theirs is not None and theirs <= ours) or not every_hour(expr) or
            not second_instant(ours, zone) or first_run(expr, zone, ours - 1) != ours):
        return None
    return "croniter %s, but from one second before ours it gives ours, %s" % (
        show(theirs, zone), show(ours, zone))


def gap_end(t, zone):
    """`t` is the instant a zone's clocks jump forward."""
    tz = ZoneInfo(zone)
    return (datetime.fromtimestamp(t - 1, tz).utcoffset() <
            datetime.fromtimestamp(t, tz).utcoffset())


def spring_forward_query(expr, zone, after, ours, theirs):
    """cron.h runs a skipped wall time of a restricted-hour schedule at the gap's end; croniter
    moves it forward in whole minutes, so with a seconds field it lands a few seconds after the
    end (sometimes on a regular run, and the two are one). First half of the check: ours is a
    gap's end and croniter's run is in the minute after it. Returns the query for the second."""
    if (ours is None or theirs is None or len(expr.split()) != 6 or every_hour(expr) or
            not gap_end(ours, zone) or not ours < theirs < ours + 60):
        return None
    return (expr, zone, ours)


def spring_forward_check(case, ours, theirs, our_next):
    """Second half: after our gap-end run, ours goes on with croniter's run or with croniter's
    next one; the sequences differ only in where the skipped run was put."""
    expr, zone, after = case
    runs = croniter_runs(expr, zone, after)
    next(runs)
    if our_next not in (theirs, next(runs)):
        return None
    return "croniter %s; ours %s (the gap's end), then %s" % (
        show(theirs, zone), show(ours, zone), show(our_next, zone))


def day_field_query(expr, zone, after, ours, theirs):
    """A day field names every day but is not written `*`, and the other day field is restricted
    with a `*` in its text (`*/2`): croniter then reads the first as `*`, so only the other
    decides; cron.h goes by the text (restricted, so either matching is enough: every day).
    Returns the query of the same expression with that field written `*`, which must give
    croniter's answer."""
    fields = expr.split()
    if len(fields) < 5 or fields[0].startswith("@"):
        return None
    seconds_first = len(fields) == 6
    dom, dow = len(fields) - 3, len(fields) - 1
    for full, other in ((dom, dow), (dow, dom)):
        if fields[full] == "*" or fields[other] == "*" or "*" not in fields[other]:
            continue
        probe = list(fields)
        probe[other] = "*"  # with the other field `*`, croniter collapses a full field to `*`
        # croniter's expansion puts a leading seconds field last.
        expanded = croniter.expand(" ".join(probe), second_at_beginning=seconds_first)[0]
        if expanded[full - 1 if seconds_first else full] == ["*"]:
            starred = list(fields)
            starred[full] = "*"
            return (" ".join(starred), zone, after)
    return None


def day_field_check(case, ours, theirs, starred_answer):
    if starred_answer != theirs:
        return None
    return "croniter %s; ours %s" % (show(theirs, case[1]), show(ours, case[1]))


# Each explanation of a difference, in the order tried. A `direct` one decides from croniter
# alone; a `query` one asks cron_next one more question (all in one batch) and then decides.
EXPLANATIONS = [
    ("fall-back", "DST fall back: croniter also runs the second instant of a repeated wall time "
     "for a restricted hour field; cron.h runs the first only", explain_fall_back, None),
    ("lord-howe", "DST fall back by 30 minutes: croniter skips second-instant runs of an "
     "every-hour schedule that it gives when asked from just before them", explain_lord_howe,
     None),
    ("spring-forward", "DST spring forward with a seconds field: croniter puts a skipped run "
     "at the gap's end plus its seconds; cron.h at the gap's end", spring_forward_query,
     spring_forward_check),
    ("day-fields", "day fields: one names every day without being `*` and the other has a `*` "
     "in its text; croniter reads the first as `*`, cron.h as restricted", day_field_query,
     day_field_check),
]


def show(t, zone):
    if t is None:
        return "none"
    return datetime.fromtimestamp(t, ZoneInfo(zone)).isoformat()


def run_tool(tool, queries):
    """cron_next's answers for (expression, zone, after) queries: unix seconds, None for "none",
    or the "error: ..." line."""
    if not queries:
        return []
    result = subprocess.run([tool], input="".join("%s\t%s\t%d\n" % q for q in queries),
                            capture_output=True, text=True, check=True)
    answers = result.stdout.splitlines()
    if len(answers) != len(queries):
        sys.exit("cron_next answered %d lines for %d queries" % (len(answers), len(queries)))
    return [None if a == "none" else a if a.startswith("error:") else int(a) for a in answers]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cases", type=int, default=20000, help="random cases")
    parser.add_argument("--dst-cases", type=int, default=5000,
                        help="more cases: schedules dense in the small hours, within 4 h of a "
                        "DST change")
    args = parser.parse_args()

    started = time.monotonic()
    rng = random.Random(args.seed)
    zone_transitions = {zone: transitions(zone) for zone in ZONES}
    cases = []
    for _ in range(args.cases):
        zone = rng.choice(ZONES)
        cases.append((expression(rng), zone, instant(rng, zone_transitions[zone])))
    dst_zones = [zone for zone in ZONES if zone_transitions[zone]]
    for _ in range(args.dst_cases):
        zone = rng.choice(dst_zones)
        cases.append((dense_expression(rng), zone, instant(rng, zone_transitions[zone], 1.0)))
    answers = run_tool(args.tool, cases)

    agreed = 0
    near_transition = 0
    agreed_near_transition = 0
    six_fields = 0
    both_day_fields = 0
    explained = {name: [] for name, _, _, _ in EXPLANATIONS}
    differing = []  # (case, ours, croniter's)
    unresolved = []  # (case, ours, theirs, [(explanation, query for cron_next)])
    for case, ours in zip(cases, answers):
        expr, zone, after = case
        fields = expr.split()
        six_fields += len(fields) == 6
        both_day_fields += len(fields) >= 5 and fields[-3] != "*" and fields[-1] != "*"
        trans = zone_transitions[zone]
        i = bisect.bisect_left(trans, after)
        near = any(abs(trans[j] - after) <= 4 * 3600 for j in (i - 1, i) if 0 <= j < len(trans))
        near_transition += near
        theirs = first_run(expr, zone, after)
        if ours == theirs:
            agreed += 1
            agreed_near_transition += near
            continue
        if isinstance(ours, str):  # a valid expression refused
            differing.append((case, ours, theirs))
            continue
        # Each explanation in turn: a direct one decides now; one with a check needs cron_next's
        # answer to its query, asked for all such cases in one more batch below.
        queries = []
        for name, _, first, check in EXPLANATIONS:
            found = first(expr, zone, after, ours, theirs)
            if found is None:
                continue
            if check is None:
                explained[name].append((case, found))
                break
            queries.append((name, found))
        else:
            unresolved.append((case, ours, theirs, queries))
    checks = {name: check for name, _, _, check in EXPLANATIONS}
    answers = iter(run_tool(args.tool, [q for _, _, _, queries in unresolved for _, q in queries]))
    for case, ours, theirs, queries in unresolved:
        found = None
        for name, _ in queries:
            answer = next(answers)  # consumed for every query, in order
            if found is None:
                found = checks[name](case, ours, theirs, answer)
                if found is not None:
                    explained[name].append((case, found))
        if found is None:
            differing.append((case, ours, theirs))

    print("seed %d: %d cases, %d random and %d dense around DST changes; %d with 6 fields, %d "
          "with both day fields restricted, %d within 4 h of a DST change; zones %s" % (
              args.seed, len(cases), args.cases, args.dst_cases, six_fields, both_day_fields,
              near_transition, ", ".join(ZONES)))
    print("agreed with croniter: %d (%d of them within 4 h of a DST change)" % (
        agreed, agreed_near_transition))
    for name, title, _, _ in EXPLANATIONS:
        print("explained, %s: %d" % (title, len(explained[name])))
        for (expr, zone, after), found in explained[name]:
            print("  %-36s %-19s after %s: %s" % (expr, zone, show(after, zone), found))
    print("unexplained differences: %d" % len(differing))
    for (expr, zone, after), ours, theirs in differing:
        print("  %-36s %-19s after %s (%d): croniter %s; ours %s" % (
            expr, zone, show(after, zone), after, show(theirs, zone),
            ours if isinstance(ours, str) else show(ours, zone)))
    print("%d passed, %d failed" % (len(cases) - len(differing), len(differing)))
    print("took %.1f s" % (time.monotonic() - started))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
