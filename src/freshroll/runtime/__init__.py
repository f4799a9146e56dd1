"""freshroll.runtime"""
