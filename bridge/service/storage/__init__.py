"""The bridge's store (SQLite or PostgreSQL) and what keeps it whole: the run lock, leader and standby, the copy to PostgreSQL, what is held back."""
