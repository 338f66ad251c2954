#!/usr/bin/env python3
"""Polls the HTTP endpoints of `dagnats-leases elect --http` processes of one key,
as an application in another language would (Python 3, standard library only).

Commands on stdin, one a line:
  add NAME URL   poll URL from now on under NAME
  end            stop, print the summary and exit (1 if any rule was broken)

On stdout, one JSON object a line:
  {"name": N, "state": "leader"|"follower"|"unreachable", "holder": H, "fence": F}
      each time what N answers changes (leader with another fence counts);
  {"summary": true, "claims": C, "tenures": [...], "violations": [...]} at the end.

The rules checked, on what the processes report (one host, one wall clock):
  - two tenures (holder, fence) never claim leadership over overlapping times:
    each claim holds from the `now` it was read at to the `deadline` it names;
  - a later tenure has a higher fence;
  - a claim is 200 with a fence, a deadline after its `now` and valid_for_ms > 0;
    anything else is 503 with leader false.
"""

import calendar
import json
import sys
import threading
import time
import urllib.error
import urllib.request

POLL_EVERY = 0.01
REQUEST_TIMEOUT = 0.3


def parse_time(text):
    """RFC 3339 UTC ("2026-10-18T12:00:00.123456789Z") to integer nanoseconds."""
    if not text.endswith("Z"):
        raise ValueError("not UTC: " + text)
    base, _, fraction = text[:-1].partition(".")
    seconds = calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S"))
    nanos = int((fraction + "000000000")[:9]) if fraction else 0
    return seconds * 1_000_000_000 + nanos


def fetch(url):
    """(status, body as a dict), or None when the process does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as reply:
        return reply.code, json.loads(reply.read())
    except (OSError, ValueError):
        return None


def main():
    targets = {}
    lock = threading.Lock()
    ended = threading.Event()

    def read_commands():
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["add"] and len(words) == 3:
                with lock:
                    targets[words[1]] = words[2]
            elif words[:1] == ["end"]:
                break
        ended.set()

    threading.Thread(target=read_commands, daemon=True).start()

    violations = []
    claims = 0
    # (holder, fence) -> [first now, last deadline], in nanoseconds.
    tenures = {}
    last_state = {}

    def emit(obj):
        print(json.dumps(obj), flush=True)

    while not ended.is_set():
        with lock:
            polled = list(targets.items())
        for name, url in polled:
            got = fetch(url)
            if got is None:
                state = ("unreachable", None, None)
            else:
                status, body = got
                if body.get("leader") is True:
                    claims += 1
                    now = parse_time(body["now"])
                    deadline = parse_time(body["deadline"])
                    fence = body.get("fence")
                    if status != 200 or not isinstance(fence, int):
                        violations.append(f"{name}: a claim with status {status}: {body}")
                    if deadline <= now or body.get("valid_for_ms", 0) <= 0:
                        violations.append(f"{name}: a claim with no time left: {body}")
                    span = tenures.setdefault((body["holder"], fence), [now, deadline])
                    span[0] = min(span[0], now)
                    span[1] = max(span[1], deadline)
                    state = ("leader", body["holder"], fence)
                else:
                    if status != 503 or body.get("leader") is not False:
                        violations.append(f"{name}: not leading with status {status}: {body}")
                    state = ("follower", body.get("holder"), None)
            if last_state.get(name) != state:
                last_state[name] = state
                emit({"name": name, "state": state[0], "holder": state[1], "fence": state[2]})
        time.sleep(POLL_EVERY)

    ordered = sorted(tenures.items(), key=lambda item: item[1][0])
    for i, ((holder_a, fence_a), (start_a, end_a)) in enumerate(ordered):
        for (holder_b, fence_b), (start_b, end_b) in ordered[i + 1:]:
            if start_b < end_a and start_a < end_b:
                violations.append(
                    f"tenures {holder_a}@{fence_a} and {holder_b}@{fence_b} overlap: "
                    f"[{start_a}, {end_a}] and [{start_b}, {end_b}] ns"
                )
            if fence_b <= fence_a:
                violations.append(
                    f"{holder_b}@{fence_b} began after {holder_a}@{fence_a} with a fence not higher"
                )
    emit({
        "summary": True,
        "claims": claims,
        "tenures": [
            {"holder": h, "fence": f, "from_ns": s, "to_ns": e} for (h, f), (s, e) in ordered
        ],
        "violations": violations,
    })
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
