"""Prometheus text exposition for a handful of counters and gauges.

Small on purpose: one registry per app (tests run several apps in one process),
label values given at increment time, text format 0.0.4. Counters are bumped from the
event loop and from worker threads (WAL, queries, symbolication) alike, so each holds a
lock: an increment is a read and a write, and a scrape must not see a dict mid-insert.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in values)
    return "{" + ",".join(f'{n}="{v}"' for n, v in zip(names, escaped, strict=True)) + "}"


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...] = (),
                 known: Iterable[str] = ()) -> None:
        """``known``: the values of a one-label counter that exist from the start, at 0 (a
        closed set, such as every reason a request can be refused for)."""
        self.name, self.help, self.label_names = name, help, labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}
        self.values.update(((value,), 0.0) for value in known)
        self.lock = threading.Lock()

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self.lock:
            self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def render(self, kind: str = "counter") -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {kind}"]
        with self.lock:
            values = sorted(self.values.items())
        for key, value in values:
            lines.append(f"{self.name}{_labels(self.label_names, key)} {value:g}")
        return lines


class Gauge(Counter):
    def set(self, value: float, *labels: str) -> None:
        with self.lock:
            self.values[labels] = value

    def render(self, kind: str = "gauge") -> list[str]:
        return super().render(kind)


class CallbackGauge:
    """A gauge read at scrape time, for values owned by another object."""

    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.name, self.help, self.read = name, help, read

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge",
                f"{self.name} {self.read():g}"]


class Summary:
    """Count and sum of observations (e.g. seconds), plus the largest one seen."""

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self.count = 0
        self.sum = 0.0
        self.max = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self.lock:
            self.count += 1
            self.sum += value
            self.max = max(self.max, value)

    def render(self) -> list[str]:
        with self.lock:
            count, total, top = self.count, self.sum, self.max
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} summary",
                f"{self.name}_count {count}", f"{self.name}_sum {total:g}",
                f"# TYPE {self.name}_max gauge", f"{self.name}_max {top:g}"]


_Item = TypeVar("_Item", bound="Counter | CallbackGauge | Summary")


class Registry:
    def __init__(self) -> None:
        self.items: list[Counter | CallbackGauge | Summary] = []

    def counter(self, name: str, help: str, labels: tuple[str, ...] = (),
                known: Iterable[str] = ()) -> Counter:
        return self._add(Counter(name, help, labels, known))

    def gauge(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._add(Gauge(name, help, labels))

    def callback(self, name: str, help: str, read: Callable[[], float]) -> CallbackGauge:
        return self._add(CallbackGauge(name, help, read))

    def summary(self, name: str, help: str) -> Summary:
        return self._add(Summary(name, help))

    def _add(self, item: _Item) -> _Item:
        self.items.append(item)
        return item

    def render(self) -> str:
        return "\n".join(line for item in self.items for line in item.render()) + "\n"
