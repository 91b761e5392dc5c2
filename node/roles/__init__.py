"""Long-running roles (solver daemon, submitter actions) and what they share."""
