"""ranknas: search_space."""
