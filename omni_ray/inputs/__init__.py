"""Prompt inputs: decoding audio and images from requests, and the checkpoint's processor."""
