"""Science: attnlib against closed forms, limits, Monte Carlo and reference implementations
(no book needed)."""
