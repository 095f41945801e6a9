"""retrieve"""
