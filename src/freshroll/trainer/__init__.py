"""freshroll.trainer"""
