"""freshroll.rewards"""
