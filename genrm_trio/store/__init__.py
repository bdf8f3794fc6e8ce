"""Shared group stores: groups kept in Redis/Valkey so several server processes serve them."""
