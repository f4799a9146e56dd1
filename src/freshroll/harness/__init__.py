"""freshroll.harness"""
