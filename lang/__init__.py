"""radixgen.lang"""
