"""freshroll.report"""
