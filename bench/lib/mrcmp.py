#!/usr/bin/env python3
"""Helpers of bench/compare.sh: parse each tool's output, and build the report.

Subcommands (each prints to stdout; errors go to stderr with exit status 1):

  osu FILE [COLUMN [rate]] OSU-style table ("# Size ..." then "SIZE VALUE..."):
                           prints "SIZE VALUE" lines (mr_pingpong, mr_bw,
                           mr_mbw_mr); COLUMN (default 1) picks the value
                           column, e.g. 2 = Messages/s of mr_mbw_mr and
                           mr_bw -m. With "rate", COLUMN holds messages/s
                           and the value is messages/s x SIZE in MB/s (10^6
                           B/s) with every digit (the MB/s column has two)
  mr FILE [FIELD]          multirail `bench --json` lines: "SIZE VALUE";
                           FIELD (default value) e.g. msg_rate for mbw_mr
  ucx FILE bw|lat|lat50 [SIZE]
                           ucx_perftest -f: the final bandwidth in MB/s
                           (10^6 B; ucx_perftest prints MiB/s), the mean
                           latency in us, or (lat50) its typical (median)
                           latency. With SIZE (bytes), bandwidth is
                           the message rate x SIZE, which keeps the digits
                           the 2-decimal MiB/s column loses for tiny messages
  iperf3 FILE uni|bidir    iperf3 -J: receiver goodput in MB/s (bidir: both
                           directions added)
  mbit RATE                a tc rate (2gbit, 500mbit, 1.5gbit, 1gibit) in Mbit/s
  report TSV META ROWS OUTDIR
                           median per row/metric/size, ratios; prints the
                           table and writes OUTDIR/results.{json,md}, table.txt.
                           TSV: row, metric (bw|bibw|lat|share), size, repeat,
                           value (or "ERR text"); META: key<TAB>value lines;
                           ROWS: id, label, rails, baseline id, stream (0|1)
                           (may be empty: no main table). When META has
                           small_part=1, a second table follows: small
                           messages, multirail vs Open MPI vs UCX (metrics
                           lat 8 B of rows *_1 / *_all; sbw, mbw, mbw_rate
                           of rows *_all)

Only the Python standard library is used.
"""

import json
import re
import statistics
import sys

MB = 1e6


def die(msg):
    print(f"mrcmp.py: {msg}", file=sys.stderr)
    sys.exit(1)


def cmd_osu(path, column="1", mode=None):
    try:
        col = int(column)
    except ValueError:
        die(f"osu: bad column {column!r}")
    if col < 1:
        die(f"osu: bad column {column!r}")
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) > col and parts[0].isdigit():
                try:
                    size, v = int(parts[0]), float(parts[col])
                    print(size, v * size / MB if mode == "rate" else v)
                    rows += 1
                except ValueError:
                    pass
    if rows == 0:
        die(f"no result lines in {path}")


def cmd_mr(path, field="value"):
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "size" in d and d.get(field) is not None:
                print(int(d["size"]), float(d[field]))
                rows += 1
                if d.get("capped"):
                    print(f"warning: {path}: size {d['size']} stopped by multirail's time cap "
                          f"after {d.get('iterations')} iterations", file=sys.stderr)
    if rows == 0:
        die(f"no JSON result lines with {field!r} in {path}")


def cmd_ucx(path, kind, size=None):
    # `ucx_perftest -f` prints one line of numbers:
    #   iterations, latency p50, latency avg, latency overall (us),
    #   bandwidth avg, bandwidth overall (MiB/s), msg rate avg, overall
    last = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.replace("Final:", "").split()
            if len(parts) >= 8:
                try:
                    last = [float(p) for p in parts[:8]]
                except ValueError:
                    continue
    if last is None:
        die(f"no ucx_perftest result line in {path}")
    if kind == "lat":
        print(last[3])
    elif kind == "lat50":
        print(last[1])
    elif size is not None:
        try:
            nbytes = int(size)
        except ValueError:
            die(f"ucx: bad size {size!r}")
        print(last[7] * nbytes / MB)  # overall messages/s x bytes per message
    else:
        print(last[5] * 1024 * 1024 / MB)


def cmd_iperf3(path, mode):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read iperf3 JSON {path}: {e}")
    if "error" in d:
        die(f"iperf3 reported: {d['error']}")
    end = d.get("end", {})
    bps = end.get("sum_received", {}).get("bits_per_second")
    if bps is None:
        die(f"no sum_received in {path}")
    if mode == "bidir":
        rev = end.get("sum_received_bidir_reverse", {}).get("bits_per_second")
        if rev is None:
            die(f"no sum_received_bidir_reverse in {path} (iperf3 >= 3.7 needed for --bidir)")
        bps += rev
    print(bps / 8 / MB)


UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "kibit": 1024, "mibit": 1024**2, "gibit": 1024**3, "tibit": 1024**4,
}


def rate_bits(rate):
    """A tc rate (2gbit, 500mbit, 1gibit, bare bits) in bit/s, or None."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-z]*)", rate.strip().lower())
    if not m or (m.group(2) or "bit") not in UNITS:
        return None
    return float(m.group(1)) * UNITS[m.group(2) or "bit"]


def cmd_mbit(rate):
    bits = rate_bits(rate)
    if bits is None:
        die(f"cannot read rate {rate!r} (expected e.g. 2gbit, 500mbit)")
    print(max(1, round(bits / 1e6)))


# TCP/IPv4 with timestamps over Ethernet, MTU 1500: 1448 B of payload per
# 1514 B the tbf shaper counts (docs/testbed.md: the 95.6% goodput ceiling).
GOODPUT = 1448 / 1514


def wire_note(meta):
    """One line: the ideal goodput and 4 MiB one-way time at the rail rates."""
    rates = [rate_bits(r) for r in meta.get("rate", "").split(",") if r]
    if not rates or None in rates:
        return None
    one = rates[0] * GOODPUT / 8
    every = sum(rates) * GOODPUT / 8
    return (f"Wire reference at {meta.get('rate')}: goodput rail0 {one / MB:.1f} MB/s, all rails "
            f"{every / MB:.1f} MB/s; 4 MiB one-way {M4 / one * 1e6:.0f} us on rail0, "
            f"{M4 / every * 1e6:.0f} us on all rails (tbf lets ~one bucket, about 120 KB per rail, "
            f"through early, so measured times can be a little lower).")


# ---------------------------------------------------------------- report

K64, M1, M4 = 65536, 1048576, 4194304
COLUMNS = [  # key, metric, size, header, unit, decimals
    ("bw_64K", "bw", K64, "bw 64K", "MB/s", 1),
    ("bw_1M", "bw", M1, "bw 1M", "MB/s", 1),
    ("bw_4M", "bw", M4, "bw 4M", "MB/s", 1),
    ("bibw_4M", "bibw", M4, "bibw 4M", "MB/s", 1),
    ("lat_8B", "lat", 8, "lat 8B", "us", 2),
    ("lat_4M", "lat", M4, "4MiB one-way", "us", 0),
]


def load_tsv(path):
    """row -> metric -> size -> list of values (floats); errors -> list of text."""
    data, errors, shares = {}, {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                continue
            row, metric, size, _rep, value = parts
            if metric == "share":
                shares[row] = [int(x) for x in value.split(",") if x]
                continue
            if value.startswith("ERR"):
                errors.setdefault(row, []).append(f"{metric} {size}: {value[4:] or 'failed'}")
                continue
            data.setdefault(row, {}).setdefault(metric, {}).setdefault(int(size), []).append(
                float(value))
    return data, errors, shares


def fmt(v, dec):
    if v is None:
        return "-"
    return f"{v:.{dec}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def read_meta(path):
    meta = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "\t" in line:
                k, v = line.rstrip("\n").split("\t", 1)
                meta[k] = v
    return meta


def read_rows(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) == 5:
                rows.append({"id": p[0], "label": p[1], "rails": int(p[2]),
                             "baseline": p[3] or None, "stream": p[4] == "1"})
    return rows


def render(h, b):
    """Aligned text table: first column left, the others right; a rule under the header."""
    w = [max(len(str(row[i])) for row in [h] + b) for i in range(len(h))]
    out = ["  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i])
                     for i, c in enumerate(row)) for row in [h] + b]
    out.insert(1, "  ".join("-" * x for x in w))
    return out


# ---------------------------------------------------------------- small messages

# The tools of the small-message table: (column header, row-id prefix).
SMALL_TOOLS = [("multirail", "mr"), ("Open MPI", "ompi"), ("UCX", "ucx")]
# Metrics of the small-message part (compare.sh records them in the same TSV).
SMALL_METRICS = ("sbw", "mbw", "mbw_rate")


def size_label(n):
    """8 -> '8 B', 2048 -> '2 KiB', 1048576 -> '1 MiB'."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def fmt_small(v, unit):
    """Enough digits for tiny bandwidths (1 B messages move ~0.1 MB/s)."""
    if v is None:
        return "-"
    if unit == "msg/s":
        return f"{v:.0f}"
    if unit == "us":
        return f"{v:.2f}"
    if abs(v) < 1:
        return f"{v:.4f}"
    if abs(v) < 100:
        return f"{v:.2f}"
    return f"{v:.1f}"


def small_report(meta, data, errors, main_ids):
    """The small-message table: one row per (test, size), one column per tool,
    and the ratios multirail / Open MPI and multirail / UCX."""
    sizes = [int(x) for x in meta.get("small_sizes_bytes", "").split(",") if x]
    pairs = meta.get("small_mbw_pairs", "2")
    mbw_size = int(meta.get("small_mbw_size", "8") or 8)
    tools = set(meta.get("small_tools", "multirail,ompi,ucx").split(","))
    measured = {"mr": "multirail" in tools, "ompi": "ompi" in tools, "ucx": "ucx" in tools}
    # (test label, metric, size, row-id suffix, unit, lower is better)
    specs = [("latency, rail0 only (lower is better)", "lat", 8, "_1", "us", True),
             ("latency, all rails (lower is better)", "lat", 8, "_all", "us", True)]
    specs += [("bw, all rails", "sbw", s, "_all", "MB/s", False) for s in sizes]
    specs += [(f"mbw_mr {pairs} pairs, all rails", "mbw", mbw_size, "_all", "MB/s", False),
              (f"mbw_mr {pairs} pairs, all rails", "mbw_rate", mbw_size, "_all", "msg/s", False)]

    def cell(row_id, metric, size):
        vals = data.get(row_id, {}).get(metric, {}).get(size) or []
        return (statistics.median(vals) if vals else None), len(vals)

    hdr = ["Test", "Size", "Unit"] + [t[0] for t in SMALL_TOOLS] + [
        "multirail/Open MPI", "multirail/UCX"]
    body, rows_json = [], []
    for label, metric, size, suffix, unit, lower in specs:
        vals, counts = {}, {}
        for _name, prefix in SMALL_TOOLS:
            vals[prefix], counts[prefix] = cell(prefix + suffix, metric, size)
        r_ompi = ratio(vals["mr"], vals["ompi"])
        r_ucx = ratio(vals["mr"], vals["ucx"])
        body.append([label, size_label(size), unit] + [fmt_small(vals[p], unit) for _n, p in SMALL_TOOLS]
                    + [fmt(r_ompi, 3), fmt(r_ucx, 3)])
        rows_json.append({"test": label, "metric": metric, "size": size, "unit": unit,
                          "lower_is_better": lower,
                          "rows": {p: p + suffix for _n, p in SMALL_TOOLS},
                          "values": {name: vals[p] for name, p in SMALL_TOOLS},
                          "samples": {name: counts[p] for name, p in SMALL_TOOLS},
                          "multirail_over_ompi": r_ompi, "multirail_over_ucx": r_ucx})

    title = ("Small messages: multirail vs Open MPI vs UCX, same rails (medians). Ratios are "
             "multirail / peer. Latency rows (us): LOWER is better, a ratio < 1 means multirail "
             "is faster. bw and mbw_mr rows: higher is better, a ratio > 1 means multirail is faster.")
    np_ = int(pairs) if str(pairs).isdigit() else 2
    notes = [
        "",
        f"Latency = one-way 8 B (round trip / 2), {meta.get('lat_repeats')} runs. bw: window of "
        f"{meta.get('window')} messages, 4-byte reply per window, {meta.get('bw_repeats')} runs. "
        f"mbw_mr: {np_} pairs at once (ranks 0..{np_ - 1} in host0 send to ranks "
        f"{np_}..{2 * np_ - 1} in host1), barrier before each window, OSU's calc_bw, "
        f"{meta.get('bw_repeats')} runs; MB = 10^6 bytes.",
        "Open MPI: mr_pingpong / mr_bw / mr_mbw_mr, ob1 + tcp BTL on the same rails; UCX: "
        "ucx_perftest tag_lat / tag_bw, UCX_TLS=tcp (bandwidth = its message rate x size). "
        "ucx_perftest has no multi-pair test: no UCX mbw_mr cell.",
    ]
    if meta.get("small_iterations"):
        notes.append(f"Iterations: {meta['small_iterations']}.")
    missing = [name for name, p in SMALL_TOOLS if not measured[p]]
    if missing:
        notes.append("Not run (--only): " + ", ".join(missing) + ".")
    failed = []
    for _name, prefix in SMALL_TOOLS:
        for suffix in ("_1", "_all"):
            rid = prefix + suffix
            for e in errors.get(rid, []):
                metric = e.split(" ", 1)[0]
                # latency failures of rows in the main table are listed there
                if metric in SMALL_METRICS or (metric == "lat" and rid not in main_ids):
                    failed.append((rid, e))
    if failed:
        notes.append("")
        notes.append("FAILED small-message measurements (see raw/ and commands.log):")
        notes += [f"  {rid}: {e}" for rid, e in failed]
    lines = [title, ""] + render(hdr, body) + notes
    md = [title, "",
          "| " + " | ".join(hdr) + " |",
          "|" + "|".join(["---", "---:", "---"] + ["---:"] * (len(hdr) - 3)) + "|"]
    md += ["| " + " | ".join(row) + " |" for row in body]
    md += [n if n else "" for n in notes]
    return {"lines": lines, "md": md,
            "json": {"rows": rows_json, "failed": [{"row": rid, "what": e} for rid, e in failed]}}


def cmd_report(tsv, meta_path, rows_path, outdir):
    meta = read_meta(meta_path)
    rows_meta = read_rows(rows_path)
    data, errors, shares = load_tsv(tsv)

    def cell(r, metric, size):
        """(median, number of samples) of one table cell."""
        if r.get("stream"):
            # iperf3: a stream has no message size; its goodput stands in
            # every bandwidth column, its bidirectional sum in bibw.
            if metric not in ("bw", "bibw"):
                return None, 0
            size = 0
        vals = data.get(r["id"], {}).get(metric, {}).get(size) or []
        return (statistics.median(vals) if vals else None), len(vals)

    table = []
    for r in rows_meta:
        rid = r["id"]
        cells, samples = {}, {}
        for key, metric, size, *_ in COLUMNS:
            cells[key], samples[key] = cell(r, metric, size)
        sh = shares.get(rid)
        share_txt = None
        if sh and sum(sh) > 0:
            share_txt = "/".join(f"{100.0 * b / sum(sh):.0f}" for b in sh)
        table.append({"id": rid, "label": r["label"], "rails": r.get("rails"),
                      "values": cells, "samples": samples, "rail_bytes": sh,
                      "rail_share_pct": share_txt,
                      # small-message failures are listed under that table
                      "errors": [e for e in errors.get(rid, [])
                                 if e.split(" ", 1)[0] not in SMALL_METRICS]})

    by_id = {t["id"]: t for t in table}
    limit = by_id.get("iperf3_sum", {}).get("values", {}).get("bw_4M")
    ratios = []
    for r in rows_meta:
        if r.get("stream"):
            continue
        v = by_id[r["id"]]["values"]
        base = by_id.get(r.get("baseline") or "", {}).get("values") if r.get("baseline") else None
        ratios.append({
            "id": r["id"], "label": r["label"],
            "bw_64K_over_iperf3": ratio(v["bw_64K"], limit),
            "bw_1M_over_iperf3": ratio(v["bw_1M"], limit),
            "bw_4M_over_iperf3": ratio(v["bw_4M"], limit),
            "bibw_4M_over_2x_iperf3": ratio(v["bibw_4M"], 2 * limit if limit else None),
            "lat_8B_over_1rail": ratio(v["lat_8B"], base["lat_8B"]) if base else None,
            "lat_4M_over_1rail": ratio(v["lat_4M"], base["lat_4M"]) if base else None,
            "baseline": r.get("baseline"),
        })

    # ---- text table
    lines = []
    hdr = ["Tool / configuration"] + [f"{c[3]} ({c[4]})" for c in COLUMNS] + ["rail bytes %"]
    body = []
    for t in table:
        body.append([t["label"]] + [fmt(t["values"][c[0]], c[5]) for c in COLUMNS]
                    + [t["rail_share_pct"] or "-"])
    rhdr = ["Ratios", "bw64K/iperf3", "bw1M/iperf3", "bw4M/iperf3", "bibw4M/(2*iperf3)",
            "lat8B 2r/1r", "4MiB 2r/1r"]
    rbody = [[x["label"], fmt(x["bw_64K_over_iperf3"], 3), fmt(x["bw_1M_over_iperf3"], 3),
              fmt(x["bw_4M_over_iperf3"], 3), fmt(x["bibw_4M_over_2x_iperf3"], 3),
              fmt(x["lat_8B_over_1rail"], 3), fmt(x["lat_4M_over_1rail"], 3)] for x in ratios]

    main = bool(rows_meta)  # empty with --only small: no main table
    if main:
        lines += render(hdr, body)
        lines.append("")
        lines += render(rhdr, rbody)
    notes = [
        "",
        "MB = 10^6 bytes. Medians over repeats (latency: %s runs, bandwidth: %s). "
        "Latency = one-way (round trip / 2), mean of one run." % (meta.get("lat_repeats"), meta.get("bw_repeats")),
        "iperf3 rows: one TCP stream per rail, all rails at once (no message size: the goodput "
        "is repeated in every bw column; bibw = both directions at once, summed).",
        "Ratios: bw / iperf3 sum of all rails; bibw / (2 x iperf3 sum); latencies: this row / its 1-rail row.",
        "rail bytes %: share of bytes the tbf qdiscs of each rail sent during the row's bw runs.",
    ]
    wn = wire_note(meta)
    if wn:
        notes.append(wn)
    # A configuration meant to use several rails that sent (almost) all its
    # bytes on one rail: say so, the bandwidth columns alone do not.
    for t in table:
        sh = t["rail_bytes"]
        if (t["rails"] or 0) >= 2 and sh and sum(sh) > 0 and min(sh) < 0.05 * sum(sh):
            busiest = max(range(len(sh)), key=lambda i: sh[i])
            notes.append(f"NOTE: {t['label']}: {100.0 * sh[busiest] / sum(sh):.0f}% of its bytes "
                         f"went over rail{busiest} alone"
                         + (" (UCX 1.13 tcp pairs lanes without checking subnets; see "
                            "bench/README.md)" if t["id"].startswith("ucx") else "") + ".")
    failed = [(t["label"], e) for t in table for e in t["errors"]]
    if failed:
        notes.append("")
        notes.append("FAILED measurements (see raw/ and commands.log):")
        notes += [f"  {lab}: {e}" for lab, e in failed]
    if main:
        lines += notes
    small = None
    if meta.get("small_part") == "1":
        main_ids = {r["id"] for r in rows_meta}
        small = small_report(meta, data, errors, main_ids)
        if lines:
            lines.append("")
        lines += small["lines"]
    text = "\n".join(lines)
    print(text)

    result = {"meta": meta, "table": table,
              "ratios": ratios, "columns": [{"key": c[0], "metric": c[1], "size": c[2],
                                              "unit": c[4]} for c in COLUMNS],
              "failed": [{"row": lab, "what": e} for lab, e in failed]}
    if small:
        result["small"] = small["json"]
        result["failed"] += small["json"]["failed"]
    with open(f"{outdir}/results.json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    md = [f"# multirail comparison, {meta.get('date', '')}", ""]
    md.append(f"Mode `{meta.get('mode')}`, testbed `{meta.get('prefix')}`: 2 hosts, "
              f"{meta.get('rails')} rails at `{meta.get('rate')}`, ranks pinned to CPUs "
              f"`{meta.get('cpus')}`.")
    if main:
        md.append("")
        md.append("| " + " | ".join(hdr) + " |")
        md.append("|" + "|".join(["---"] + ["---:"] * (len(hdr) - 1)) + "|")
        md += ["| " + " | ".join(row) + " |" for row in body]
        md.append("")
        md.append("| " + " | ".join(rhdr) + " |")
        md.append("|" + "|".join(["---"] + ["---:"] * (len(rhdr) - 1)) + "|")
        md += ["| " + " | ".join(row) + " |" for row in rbody]
        md += [n if n else "" for n in notes]
    if small:
        md += ["", "## Small messages", ""] + small["md"]
    md += ["", "## Software", ""]
    for k in ("kernel", "congestion_control", "congestion_control_hosts", "openmpi", "ucx",
              "iperf3", "multirail", "multirail_commit", "multirail_binary", "rustc", "cpu", "cpus_online",
              "loadavg_start", "loadavg_end", "iterations", "small_iterations", "measure_seconds",
              "total_seconds", "netdev_order_host0", "netdev_order_host1"):
        if k in meta:
            md.append(f"* {k}: `{meta[k]}`")
    md += ["", "## Command line", "", "```", meta.get("command", ""), "```", "",
           "Every command the run executed is in `commands.log`; raw outputs are in `raw/`."]
    with open(f"{outdir}/results.md", "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    with open(f"{outdir}/table.txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    cmd, args = argv[1], argv[2:]
    try:
        if cmd == "osu" and (len(args) in (1, 2) or (len(args) == 3 and args[2] == "rate")):
            cmd_osu(*args)
        elif cmd == "mr" and len(args) in (1, 2):
            cmd_mr(*args)
        elif cmd == "ucx" and len(args) in (2, 3) and args[1] in ("bw", "lat", "lat50"):
            cmd_ucx(*args)
        elif cmd == "iperf3" and len(args) == 2 and args[1] in ("uni", "bidir"):
            cmd_iperf3(*args)
        elif cmd == "mbit" and len(args) == 1:
            cmd_mbit(args[0])
        elif cmd == "report" and len(args) == 4:
            cmd_report(*args)
        else:
            die(f"bad usage: {' '.join(argv[1:])}\n{__doc__}")
    except OSError as e:
        die(str(e))


if __name__ == "__main__":
    main(sys.argv)
