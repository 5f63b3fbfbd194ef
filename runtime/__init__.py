"""radixgen.runtime"""
