// A KIP-848 consumer group member: the Java consumer with group.protocol=consumer (the
// broker-side assignor; ConsumerGroupHeartbeat instead of JoinGroup/SyncGroup).
// Prints "ASSIGNED <p,p,...>" at every assignment change and "RECORD <partition> <offset>
// <value>" per record; runs until its stdin closes, then commits and leaves the group.
// Usage: Kip848Consumer <bootstrap> <topic> <group>
import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class Kip848Consumer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[2]);
        props.put("group.protocol", "consumer");
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) { }
            } catch (Exception ignored) { }
            stop.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        TreeSet<Integer> assigned = new TreeSet<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[1]), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    commit(consumer);
                    for (TopicPartition tp : partitions) assigned.remove(tp.partition());
                    report();
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    for (TopicPartition tp : partitions) assigned.add(tp.partition());
                    report();
                }

                private void report() {
                    StringBuilder line = new StringBuilder("ASSIGNED ");
                    for (int p : assigned) line.append(p).append(',');
                    System.out.println(line);
                    System.out.flush();
                }
            });
            while (!stop.get()) {
                int polled = 0;
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("RECORD " + record.partition() + " " + record.offset() + " "
                        + record.value());
                    polled++;
                }
                System.out.flush();
                if (polled > 0) commit(consumer);
            }
        }
        System.out.println("CLOSED");
    }

    // A commit can fail while the member's assignment moves (KIP-848 epochs): say so and go on;
    // the test produces only once the assignment is stable, so no record is read twice.
    private static void commit(KafkaConsumer<String, String> consumer) {
        try {
            consumer.commitSync();
        } catch (RuntimeException e) {
            System.out.println("COMMIT-FAILED " + e);
            System.out.flush();
        }
    }
}
