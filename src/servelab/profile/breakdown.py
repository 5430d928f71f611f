"""Kernel categories (rules as data), per-category and top-kernel tables, and trace diffs.

Category time is the sum of activity durations (so categories sum exactly to the kernel time);
`exclusive_us` is the part of the GPU timeline where only that category runs, which is what
making it free could save (see `whatif.py`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError
from servelab.profile.steps import StepSet
from servelab.profile.trace import KIND_NAMES, Trace

BUILTIN_RULES = Path(__file__).with_name("rules.toml")


@dataclass(frozen=True, slots=True)
class Rule:
    """Activities of `kinds` whose name matches any of `patterns` belong to `category`."""

    category: str
    patterns: tuple[re.Pattern, ...]
    kinds: frozenset[str]
    source: str


class Rules:
    """An ordered list of rules; the first match decides. Results are cached per name."""

    def __init__(self, rules: list[Rule], fallback: str = "other") -> None:
        self.rules = rules
        self.fallback = fallback
        self._cache: dict[tuple[str, int], str] = {}

    @property
    def categories(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.rules:
            seen.setdefault(r.category, None)
        seen.setdefault(self.fallback, None)
        return list(seen)

    def classify(self, name: str, kind: int = 0) -> str:
        """Category of an activity `name` of kind index `kind` (0 kernel, 1 memcpy, 2 memset)."""
        key = (name, kind)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.fallback
            kname = KIND_NAMES[kind]
            for r in self.rules:
                if kname in r.kinds and any(p.search(name) for p in r.patterns):
                    hit = r.category
                    break
            self._cache[key] = hit
        return hit


def _parse_rules(doc: dict, source: str) -> tuple[list[Rule], str | None, bool]:
    raw = doc.get("rule", [])
    if not isinstance(raw, list):
        raise UserError(f"{source}: 'rule' must be an array of tables ([[rule]])")
    out = []
    for n, r in enumerate(raw):
        where = f"{source}: [[rule]] #{n + 1}"
        if not isinstance(r, dict) or not isinstance(r.get("category"), str):
            raise UserError(f"{where} needs a string 'category'")
        pats = r.get("patterns")
        if not isinstance(pats, list) or not pats or not all(isinstance(p, str) for p in pats):
            raise UserError(f"{where} ({r['category']}) needs 'patterns', a list of regex strings")
        kinds = r.get("kinds", ["kernel"])
        bad = [k for k in kinds if k not in KIND_NAMES]
        if bad:
            raise UserError(f"{where}: unknown kinds {bad}; known: {list(KIND_NAMES)}")
        try:
            compiled = tuple(re.compile(p, re.IGNORECASE) for p in pats)
        except re.error as exc:
            raise UserError(f"{where} ({r['category']}): bad regex: {exc}") from None
        out.append(Rule(r["category"], compiled, frozenset(kinds), source))
    fallback = doc.get("fallback")
    return out, fallback if isinstance(fallback, str) else None, bool(doc.get("replace", False))


def load_rules(user_file: str | Path | None = None) -> Rules:
    """Built-in rules, with a user TOML's rules tried first (or alone with `replace = true`)."""
    with open(BUILTIN_RULES, "rb") as f:
        builtin, fallback, _ = _parse_rules(tomllib.load(f), "built-in rules.toml")
    if user_file is None:
        return Rules(builtin, fallback or "other")
    p = Path(user_file)
    try:
        with open(p, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"rules file {p} does not exist") from None
    except OSError as exc:  # a folder, no permission
        raise UserError(f"rules file {p} cannot be read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"rules file {p} is not valid TOML text: {exc}") from None
    user, ufallback, replace = _parse_rules(doc, str(p))
    rules = user if replace else user + builtin
    return Rules(rules, ufallback or fallback or "other")


def short_name(name: str, width: int = 72) -> str:
    """A readable kernel name: drop `void `, namespaces and the parameter list."""
    s = name[5:] if name.startswith("void ") else name
    s = s.replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(s):  # cut the "(args...)" that follows the name at template depth 0
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0 and s[i - 1] != " ":
            s = s[:i]
            break
    base = s.split("<", 1)[0]
    if "::" in base:
        s = base.rsplit("::", 1)[1] + s[len(base) :]
    return s if len(s) <= width else s[: width - 3] + "..."


@dataclass(frozen=True, slots=True)
class CategoryRow:
    """Time of one category over the analysed steps."""

    category: str
    total_us: float
    share: float  # of all GPU activity time in the steps
    count: int
    per_step_us: float


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One kernel name's count, total, mean and share."""

    name: str
    short: str
    category: str
    count: int
    total_us: float
    mean_us: float
    share: float


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Categories and kernels of the activities inside the steps."""

    categories: list[CategoryRow]
    kernels: list[KernelRow]
    kernel_total_us: float
    n_steps: int
    activity_category: dict[int, str]  # activity index -> category


def breakdown(trace: Trace, steps: StepSet, rules: Rules) -> Breakdown:
    """Sum activity time per category and per kernel name over all steps."""
    cat_t: dict[str, float] = {}
    cat_n: dict[str, int] = {}
    k_t: dict[int, float] = {}
    k_n: dict[int, int] = {}
    k_kind: dict[int, int] = {}
    act_cat: dict[int, str] = {}
    for st in steps.steps:
        for i in st.activities:
            nid = trace.name_idx[i]
            kind = trace.kind[i]
            c = rules.classify(trace.names[nid], kind)
            act_cat[i] = c
            d = trace.dur_us[i]
            cat_t[c] = cat_t.get(c, 0.0) + d
            cat_n[c] = cat_n.get(c, 0) + 1
            k_t[nid] = k_t.get(nid, 0.0) + d
            k_n[nid] = k_n.get(nid, 0) + 1
            k_kind[nid] = kind
    total = sum(cat_t.values())
    n_steps = max(len(steps.steps), 1)
    share = (lambda t: t / total) if total > 0 else (lambda t: float("nan"))
    cats = [
        CategoryRow(c, cat_t[c], share(cat_t[c]), cat_n[c], cat_t[c] / n_steps)
        for c in sorted(cat_t, key=cat_t.__getitem__, reverse=True)
    ]
    kernels = [
        KernelRow(
            name=trace.names[nid],
            short=short_name(trace.names[nid]),
            category=rules.classify(trace.names[nid], k_kind[nid]),
            count=k_n[nid],
            total_us=k_t[nid],
            mean_us=k_t[nid] / k_n[nid],
            share=share(k_t[nid]),
        )
        for nid in sorted(k_t, key=k_t.__getitem__, reverse=True)
    ]
    return Breakdown(cats, kernels, total, len(steps.steps), act_cat)


@dataclass(frozen=True, slots=True)
class DiffRow:
    """One category or kernel in two traces, per step (traces may hold different step counts)."""

    key: str
    a_per_step_us: float
    b_per_step_us: float

    @property
    def delta_us(self) -> float:
        return self.b_per_step_us - self.a_per_step_us

    @property
    def ratio(self) -> float:
        return self.b_per_step_us / self.a_per_step_us if self.a_per_step_us > 0 else float("nan")


def diff(a: Breakdown, b: Breakdown, top: int = 15) -> tuple[list[DiffRow], list[DiffRow]]:
    """Per-step time per category and per kernel (top by the larger side), A vs B."""
    na, nb = max(a.n_steps, 1), max(b.n_steps, 1)
    ca = {r.category: r.total_us / na for r in a.categories}
    cb = {r.category: r.total_us / nb for r in b.categories}
    cats = [DiffRow(k, ca.get(k, 0.0), cb.get(k, 0.0)) for k in sorted(set(ca) | set(cb))]
    cats.sort(key=lambda r: max(r.a_per_step_us, r.b_per_step_us), reverse=True)
    ka = {r.name: r.total_us / na for r in a.kernels}
    kb = {r.name: r.total_us / nb for r in b.kernels}
    names = sorted(set(ka) | set(kb), key=lambda k: max(ka.get(k, 0.0), kb.get(k, 0.0)), reverse=True)
    kernels = [DiffRow(k, ka.get(k, 0.0), kb.get(k, 0.0)) for k in names[:top]]
    return cats, kernels
