"""Training-side fault tolerance: checkpoint manager, resume, topology check, heartbeats, error files."""
