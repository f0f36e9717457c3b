"""Failure classification: plain records in, a Verdict out (see taxonomy)."""
