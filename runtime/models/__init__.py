"""radixgen.runtime.models"""
