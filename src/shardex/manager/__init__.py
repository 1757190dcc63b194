"""shardex.manager"""
