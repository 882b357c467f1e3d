// Client-quota administration with the Java AdminClient (KIP-546), as an operator's program
// would do it: Admin.alterClientQuotas / describeClientQuotas on user entities.
// Usage: QuotaAdmin <bootstrap> <op> [<op> ...], each op one argument:
//   alter:<user>:<key>=<value>[,<key>=<value>...]   (<user> "<default>" = the default user;
//                                                    value "-" removes the key)
//   describe:<user>                                  (exact match on that user entity)
//   await:<user>:<key>[,<key>...]                    describe until every key shows (30 s at
//                                                    most): a KRaft broker answers describe
//                                                    from its metadata image, which can trail
//                                                    the controller's commit of an alter
// Prints per op "ALTERED <user>" or "DESCRIBED <user> <key>=<value>,..." (keys sorted; nothing
// after the user when the entity has no quota), or "FAILED <op> <exception class>: <message>".
// Extra client properties come from the system property admin.config (a properties file).
import java.io.FileReader;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;

public class QuotaAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        String config = System.getProperty("admin.config");
        if (config != null) {
            try (FileReader reader = new FileReader(config)) {
                props.load(reader);
            }
        }
        props.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(props)) {
            for (int i = 1; i < args.length; i++) {
                String op = args[i];
                String[] parts = op.split(":", 3);
                String user = parts[1];
                String name = user.equals("<default>") ? null : user;
                ClientQuotaEntity entity = new ClientQuotaEntity(
                    Collections.singletonMap(ClientQuotaEntity.USER, name));
                try {
                    if (parts[0].equals("alter")) {
                        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
                        for (String pair : parts[2].split(",")) {
                            String[] kv = pair.split("=", 2);
                            Double value = kv[1].equals("-") ? null : Double.valueOf(kv[1]);
                            ops.add(new ClientQuotaAlteration.Op(kv[0], value));
                        }
                        admin.alterClientQuotas(List.of(new ClientQuotaAlteration(entity, ops)))
                            .all().get();
                        System.out.println("ALTERED " + user);
                    } else {
                        List<String> awaited = parts[0].equals("await")
                            ? List.of(parts[2].split(",")) : List.of();
                        long deadline = System.nanoTime() + 30_000_000_000L;
                        ClientQuotaFilterComponent component = name == null
                            ? ClientQuotaFilterComponent.ofDefaultEntity(ClientQuotaEntity.USER)
                            : ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, name);
                        ClientQuotaFilter filter = ClientQuotaFilter.containsOnly(List.of(component));
                        Map<ClientQuotaEntity, Map<String, Double>> quotas =
                            admin.describeClientQuotas(filter).entities().get();
                        while (!quotas.getOrDefault(entity, Map.of()).keySet().containsAll(awaited)
                                && System.nanoTime() < deadline) {
                            Thread.sleep(100);
                            quotas = admin.describeClientQuotas(filter).entities().get();
                        }
                        StringBuilder line = new StringBuilder("DESCRIBED " + user + " ");
                        String sep = "";
                        Map<String, Double> values = quotas.getOrDefault(entity, Map.of());
                        for (Map.Entry<String, Double> e : new TreeMap<>(values).entrySet()) {
                            line.append(sep).append(e.getKey()).append('=').append(e.getValue());
                            sep = ",";
                        }
                        System.out.println(line.toString().trim());
                    }
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    System.out.println("FAILED " + op + " " + cause.getClass().getSimpleName()
                        + ": " + cause.getMessage());
                }
                System.out.flush();
            }
        }
    }
}
