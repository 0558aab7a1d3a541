#!/usr/bin/env python3
"""Checks manifests/monitoring against the metrics the code exports, so that renaming a metric
breaks the build instead of a dashboard: every PromQL expression of the Grafana dashboard and
of the PrometheusRule is parsed, and every metric it selects must be one the vLLM adapter
documents (the table in offload-agent/README.md, itself checked against vLLM's real /metrics
by tests/vllm/test_metrics.py) or one the webhook renders (the HELP lines of
webhook/src/metrics.cc). Also checks that the monitoring manifests stay out of manifests/base.

The parser covers the PromQL the files use (selectors, range and subqueries, offset and @,
functions and aggregations with by/without, binary operators with bool, on/ignoring and
group_left/right); an expression it cannot parse is an error, as is an unknown function.
Needs python3 and PyYAML only."""

import json
import pathlib
import re
import sys

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "day_of_year",
    "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time",
    "ln", "log10", "log2", "max_over_time", "min_over_time", "minute", "month",
    "predict_linear", "present_over_time", "quantile_over_time", "rate", "resets", "round",
    "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time",
    "sum_over_time", "time", "timestamp", "vector", "year",
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile"}
BINARY = {"+", "-", "*", "/", "%", "^", "==", "!=", "<=", ">=", "<", ">", "and", "or", "unless"}
MATCH_OPS = {"=", "!=", "=~", "!~"}
# Grafana's interval variables stand where PromQL wants a duration.
GRAFANA_DURATIONS = re.compile(r"\$__(rate_interval|interval|range)\b")

TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[iI]nf|NaN)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=@])
  | (?P<punct>[(){}\[\],:])
""", re.X)


class PromQLError(ValueError):
    pass


def tokenize(expr: str) -> list[tuple[str, str]]:
    text = GRAFANA_DURATIONS.sub("5m", expr)
    tokens, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise PromQLError(f"unexpected {text[pos:pos + 20]!r} at {pos}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    return tokens


class Parser:
    """Recursive descent over the tokens; collects the metric names of every selector."""

    def __init__(self, expr: str):
        self.tokens = tokenize(expr)
        self.i = 0
        self.metrics: set[str] = set()

    def peek(self, offset: int = 0) -> tuple[str, str]:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        k, v = self.peek()
        if (kind and k != kind) or (value and v != value):
            raise PromQLError(f"expected {value or kind}, found {v or 'the end'!r}")
        self.i += 1
        return v

    def accept(self, value: str) -> bool:
        if self.peek()[1] == value and self.peek()[0] in ("punct", "op", "ident"):
            self.i += 1
            return True
        return False

    def parse(self) -> set[str]:
        self.expr()
        if self.peek()[0] != "end":
            raise PromQLError(f"unexpected {self.peek()[1]!r} after a complete expression")
        return self.metrics

    def expr(self) -> None:
        self.unary()
        while self.peek()[1] in BINARY and self.peek()[0] in ("op", "ident"):
            self.i += 1
            self.accept("bool")
            if self.peek()[1] in ("on", "ignoring"):
                self.i += 1
                self.labels()
                if self.peek()[1] in ("group_left", "group_right"):
                    self.i += 1
                    if self.peek()[1] == "(":
                        self.labels()
            self.unary()

    def unary(self) -> None:
        if self.peek()[1] in ("+", "-"):
            self.i += 1
            self.unary()
            return
        self.primary()
        if self.accept("["):
            self.take("duration")
            if self.accept(":"):
                if self.peek()[0] == "duration":
                    self.i += 1
            self.take("punct", "]")
        if self.accept("offset"):
            self.accept("-")
            self.take("duration")
        if self.accept("@"):
            if self.peek()[1] in ("start", "end"):
                self.i += 1
                self.take("punct", "(")
                self.take("punct", ")")
            else:
                self.take("number")

    def primary(self) -> None:
        kind, value = self.peek()
        if kind in ("number", "string"):
            self.i += 1
        elif value == "(" and kind == "punct":
            self.i += 1
            self.expr()
            self.take("punct", ")")
        elif value == "{" and kind == "punct":
            self.matchers()
        elif kind == "ident" and value in AGGREGATIONS and self.peek(1)[1] in ("(", "by",
                                                                                "without"):
            self.i += 1
            grouped = self.grouping()
            self.take("punct", "(")
            self.expr()
            if self.accept(","):  # topk(k, v), quantile(q, v), count_values("l", v)
                self.expr()
            self.take("punct", ")")
            if not grouped:
                self.grouping()
        elif kind == "ident" and self.peek(1)[1] == "(":
            if value not in FUNCTIONS:
                raise PromQLError(f"unknown function {value!r}")
            self.i += 2
            if not self.accept(")"):
                self.expr()
                while self.accept(","):
                    self.expr()
                self.take("punct", ")")
        elif kind == "ident":
            self.i += 1
            self.metrics.add(value)
            if self.peek()[1] == "{":
                self.matchers()
        else:
            raise PromQLError(f"expected an expression, found {value or 'the end'!r}")

    def grouping(self) -> bool:
        if self.peek()[1] in ("by", "without"):
            self.i += 1
            self.labels()
            return True
        return False

    def labels(self) -> None:
        self.take("punct", "(")
        if not self.accept(")"):
            self.take("ident")
            while self.accept(","):
                if self.peek()[1] == ")":
                    break
                self.take("ident")
            self.take("punct", ")")

    def matchers(self) -> None:
        self.take("punct", "{")
        while not self.accept("}"):
            label = self.take("ident")
            op = self.take("op")
            if op not in MATCH_OPS:
                raise PromQLError(f"label {label}: {op!r} is not a matcher")
            value = self.take("string")
            if label == "__name__" and op == "=":
                self.metrics.add(value[1:-1])
            if not self.accept(","):
                self.take("punct", "}")
                break


def metric_names(expr: str) -> set[str]:
    return Parser(expr).parse()


def known_metrics() -> dict[str, str]:
    """name -> where it is defined, with a histogram's _bucket/_sum/_count series."""
    known: dict[str, str] = {}
    readme = REPO / "offload-agent" / "README.md"
    rows = re.findall(r"^\| `(vllm:[a-z_:]+)` \| (counter|gauge|histogram) \|",
                      readme.read_text(), flags=re.M)
    if not rows:
        sys.exit(f"check_monitoring: no metric table in {readme}")
    source = (REPO / "webhook" / "src" / "metrics.cc").read_text()
    webhook = re.findall(r"# TYPE (kvoffload_[a-z_]+) (counter|gauge|histogram)", source)
    if not webhook:
        sys.exit("check_monitoring: no TYPE lines in webhook/src/metrics.cc")
    helped = set(re.findall(r"# HELP (kvoffload_[a-z_]+) ", source))
    # What Prometheus itself writes for every target it scrapes.
    known["up"] = "Prometheus (one series per scraped target)"
    for where, entries in (("offload-agent/README.md", rows),
                           ("webhook/src/metrics.cc", [e for e in webhook if e[0] in helped])):
        for name, kind in entries:
            known[name] = where
            if kind == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    known[name + suffix] = where
    return known


def expressions() -> list[tuple[str, str]]:
    """(where, expr) for every PromQL expression of the dashboard and the rules."""
    out = []
    dashboard = json.loads((MONITORING / "kv-offload-dashboard.json").read_text())

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"dashboard panel {p.get('title')!r} {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else None
        if query:
            m = re.fullmatch(r"label_values\((.+),\s*[A-Za-z_]+\)", query)
            if not m:
                raise PromQLError(f"variable {var['name']}: {query!r} is not label_values(...)")
            out.append((f"dashboard variable {var['name']}", m.group(1)))
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            out.append((f"rule {r.get('alert') or r.get('record')}", r["expr"]))
    return out


def self_check() -> None:
    """The checker itself must reject what it is there to catch."""
    assert metric_names('sum by (tier) (rate(a_total{m=~"$model"}[$__rate_interval])) / '
                        "on (tier) group_left b") == {"a_total", "b"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) > 2 "
                        "and x offset 1h == bool 0") == {"h_bucket", "x"}
    for bad in ("sum(rate(a[5m])", "rate(a[5m]))", "rat(a[5m])", 'a{tier="cpu"', "a b",
                "sum by tier (a)", 'a{tier>"x"}', "a[5]"):
        try:
            metric_names(bad)
        except PromQLError:
            continue
        raise AssertionError(f"the parser accepted {bad!r}")


def main() -> int:
    self_check()
    known = known_metrics()
    errors, checked, used = [], 0, set()
    for where, expr in expressions():
        try:
            names = metric_names(expr)
        except PromQLError as e:
            errors.append(f"{where}: does not parse: {e}\n    {expr.strip()}")
            continue
        checked += 1
        if not names:
            errors.append(f"{where}: selects no metric: {expr.strip()}")
        for name in sorted(names - known.keys()):
            errors.append(f"{where}: {name} is neither in the metric table of "
                          f"offload-agent/README.md nor rendered by webhook/src/metrics.cc; "
                          f"rename it to the exported name or export it")
        used |= names
    base = (REPO / "manifests" / "base" / "kustomization.yaml").read_text()
    if "monitoring" in base:
        errors.append("manifests/base/kustomization.yaml references the monitoring manifests; "
                      "they are optional (docs/deploy.md) and need the Prometheus Operator")
    for e in errors:
        print(f"check_monitoring: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"check_monitoring: {checked} expressions parse; the {len(used)} metrics they select "
          f"are all exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
