"""ranknas: trainers."""
