"""shardex.cli"""
