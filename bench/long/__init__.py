"""Long context: each switch's speed and estimate, the longest length run for real, windowed
attention's scaling and quality (text and DiT images)."""
