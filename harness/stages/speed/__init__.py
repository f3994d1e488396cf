"""The speed stage: pp and tg tok/s of pairs of configurations, judged by the matrix's speed rules."""
