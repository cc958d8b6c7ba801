"""Rate limiting as a token bucket against a monotonic clock: batches, not a sleep per message (pure)."""

from __future__ import annotations


class TokenBucket:
    """Tokens refill at `rate` per second up to `burst_s` seconds' worth; rate 0 means unlimited."""

    def __init__(self, rate: float, now: float, burst_s: float = 0.05) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * burst_s)
        self.tokens = 1.0
        self.last = now

    def take(self, want: int, now: float) -> int:
        """How many of `want` messages may go now (0 means wait `wait_s()`)."""
        if self.rate <= 0:
            return want
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        granted = min(want, int(self.tokens))
        self.tokens -= granted
        return granted

    def batch(self, seconds: float = 0.005) -> float:
        """Tokens worth waiting for: `seconds` of sending (at least 1, at most the capacity)."""
        return min(self.capacity, max(1.0, self.rate * seconds))

    def wait_s(self, tokens: float = 1.0) -> float:
        """Seconds until `tokens` are available, as of the last take()."""
        if self.rate <= 0 or self.tokens >= tokens:
            return 0.0
        return (tokens - self.tokens) / self.rate
