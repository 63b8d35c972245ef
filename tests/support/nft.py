"""The console's nft table, made the test's own."""

from __future__ import annotations

from tests.support.root import require_root


def nft_table_for(settings, table: str, *, create: bool = True):
    """Fixture body: make ``table`` the console's nft table (``settings.KICI_NFT_TABLE``), create it
    unless ``create`` is False (the code under test must then create it), yield its ``NftClient``,
    and drop it afterwards. Use as ``yield from nft_table_for(settings, TABLE)``; needs root."""
    from network.nft.apply import NftClient

    require_root()
    settings.KICI_NFT_TABLE = table
    client = NftClient(table)
    if create:
        client.ensure_table()
    yield client
    client.delete_table()


def drop_tables(table: str) -> None:
    """Drop the console tables named ``table``, every family (``NftClient.delete_table``), when
    nothing is left to test with them; a failure is printed, not raised (it runs when the session
    ends)."""
    import sys

    from network.nft.apply import NftClient, NftError

    try:
        NftClient(table).delete_table()
    except NftError as exc:
        print(f"could not drop the nft tables {table}: {exc}", file=sys.stderr)
