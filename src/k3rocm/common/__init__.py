"""What more than one wing of the distribution uses: the floor every wing
stands on, importing none of them."""
