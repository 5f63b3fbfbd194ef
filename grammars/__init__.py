"""radixgen.grammars"""
