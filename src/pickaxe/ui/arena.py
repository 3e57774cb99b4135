"""The arena pages and API of ``pickaxe ui`` (being written)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
"""Routes of the arena; ``pickaxe.ui.app.create_app`` includes them."""
