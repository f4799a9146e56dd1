"""freshroll.engines"""
