"""Benchmarks, fault injection and the cluster-scale ETTR simulator."""
