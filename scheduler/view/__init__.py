"""view"""
