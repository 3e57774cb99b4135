"""The playground pages and API of ``pickaxe ui`` (being written)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
"""Routes of the playground; ``pickaxe.ui.app.create_app`` includes them."""
