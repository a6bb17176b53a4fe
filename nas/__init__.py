"""ranknas: nas."""
