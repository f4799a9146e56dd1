"""freshroll.testing"""
