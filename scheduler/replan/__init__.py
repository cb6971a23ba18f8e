"""replan"""
