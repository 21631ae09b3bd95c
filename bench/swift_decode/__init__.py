"""Benchmark: the Swift capture decoder and matcher against tshark (see ``__main__``)."""
