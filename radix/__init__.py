"""radixgen.radix"""
