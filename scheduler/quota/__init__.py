"""quota"""
