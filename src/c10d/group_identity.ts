/**
 * Who a process group is: the links it runs over, its members, this rank in it and its store.
 * A top-level group makes its links and takes the rendezvous's rank; a subgroup shares its
 * parent's links and store prefix. Apart from the process group (process_group.ts), whose
 * constructor then wires the group up.
 */
import type { SharedLinks } from '../transport/shared_links.ts';
import type { GroupInit, ResolvedLinkOptions } from './group_options.ts';
import { topLevelLinks } from './group_transport.ts';
import { PrefixStore, type Store } from './store_interface.ts';
import { GroupMembers, type SubgroupSpec } from './subgroups.ts';

export interface GroupIdentity {
  shared: SharedLinks;
  members: GroupMembers;
  rank: number;
  store: Store;
}

/** The top-level group of `init`, or with `sub` the subgroup it describes. */
export function groupIdentity(init: GroupInit, options: ResolvedLinkOptions, sub?: SubgroupSpec): GroupIdentity {
  if (sub) {
    const members = new GroupMembers(sub.id, sub.ranks);
    return { shared: sub.shared, members, rank: members.ranks.indexOf(sub.shared.rank), store: sub.store };
  }
  return {
    shared: topLevelLinks(init, options),
    members: new GroupMembers(
      0,
      Array.from({ length: init.worldSize }, (_, r) => r),
    ),
    rank: init.rank,
    store: new PrefixStore(`pg/${init.groupKey}`, init.client),
  };
}
